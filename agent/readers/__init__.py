"""One module per kernel or kube-proxy source. Readers only read."""
