"""The SQL store (SQLite or PostgreSQL): schema, engine, ingest, retention, SQL helpers. Imports
nothing above it."""
