"""The daemon: the scheduled pipeline (collect, audit, report, notify, chargeback), leases, its
``/healthz`` and ``/metrics``."""
