// prometheus-operator v0.85.0: only its published module's CRDs
// (example/prometheus-operator-crd/), which scripts/build-upstream fetches for the manifests'
// tests (PodMonitor, PrometheusRule). Written by scripts/upstream-module; go.sum pins the download.
module ipvs-leftovers/upstream/prometheus-operator-v0.85.0

go 1.26.0

require github.com/prometheus-operator/prometheus-operator v0.85.0
