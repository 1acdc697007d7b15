# The catalog's image: workers, migrations and the explorer. torch comes first, pinned;
# on x86-64 Linux its PyPI wheel includes CUDA, so the same image serves GPU workers.
FROM python:3.11-slim
WORKDIR /app
RUN pip install --no-cache-dir torch==2.13.0
COPY pyproject.toml README.md alembic.ini ./
COPY catalog catalog
COPY schema schema
COPY migrations migrations
COPY jobs jobs
COPY ui ui
COPY reports reports
RUN pip install --no-cache-dir .
ENV NCAT_HOME=/data/ncat
