// Package deploy holds what runs nodepool in production: the Kubernetes
// manifests (a kustomization: nats/, nodepool/, keda/), the image tool
// (cmd/nodepool-image) and the test that decodes every manifest strictly
// into the Kubernetes and KEDA API types. It is a Go module of its own so
// that the main module does not depend on the Kubernetes libraries; it
// uses the main module through a replace directive, so after the main
// module's requirements change, run `go mod tidy` here too (.ci/run tests
// with -mod=mod, which adds what is missing).
package deploy
