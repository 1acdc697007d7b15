"""The catalog's PostgreSQL store: settings, engine, tables, the bulk writer, views."""
