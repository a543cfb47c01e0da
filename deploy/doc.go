// Package deploy holds what runs nodepool in production: the Kubernetes
// manifests (a kustomization: nats/, nodepool/, keda/), the image tool
// (cmd/nodepool-image) and the tests that decode every manifest strictly
// into the Kubernetes and KEDA API types and apply them with
// `kubectl apply --dry-run=server` to a real API server (internal/k8stest).
// It is a Go module of its own so that the main module does not depend on
// kustomize and KEDA; it
// uses the main module through a replace directive, so after the main
// module's requirements change, run `go mod tidy` here too (.ci/run tests
// with -mod=mod, which adds what is missing).
package deploy
