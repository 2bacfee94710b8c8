"""The audit: judge telemetry per bucket (:mod:`.verdict`, :mod:`.judge`), attribute it to allocations
(:mod:`.run`), find problems by family (:mod:`.findings` and the family modules), price them
(:mod:`.money`), and ask what-if."""
