"""Jobs: the queue (enqueue, Celery workers, the reconciler), the planner, and the ``ncat``
command line that drives everything."""
