"""The collector: the admission loop (``loop``), acceptance rules (``acceptance``), the
reconciler that marks doubt and re-queues lost jobs (``reconciler``) and the Prometheus
exporter (``metrics``)."""
