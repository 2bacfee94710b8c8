"""The read-only web UI: pages and CSV over the store and the latest audit."""
