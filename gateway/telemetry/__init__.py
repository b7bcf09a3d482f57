"""What the gateway tells its operators while it runs: structured logs and Prometheus metrics. Every other
sub-package reports through these, so they sit below all of them."""
