"""Jobs: the command line now; Celery workers and enqueueing come with the store."""
