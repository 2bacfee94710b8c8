"""gpu-audit: find GPUs that were reserved but did no work, prove it with the metrics that measure work
(DCGM SM, Tensor and DRAM activity), and put a price on it.

Library API (the CLI is a thin layer over it)::

    from connectors import load_config  # auditor.config.load + each source checked by its connector
    from auditor.store.engine import Store
    from auditor.collect import collect
    from auditor.audit.run import run_audit
"""

__version__ = "0.1.0"
