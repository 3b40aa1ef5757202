// The test node's sandbox ("pause") container: a static binary built by scripts/build_node.py and
// packed into an OCI archive offline (no image registry is reachable).
module convgate.local/kube/pause

go 1.26.0
