"""smetric-router: SMetric's balanced session-centric scheduling for SGLang clusters."""

__version__ = "0.1.0"
