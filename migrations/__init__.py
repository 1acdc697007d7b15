"""Alembic's migrations of the catalog's schema (env.py, versions/): installed with the
project's packages, so that ``ncat migrate`` runs from an image or a wheel
(schema.engine.alembic_config points Alembic here)."""
