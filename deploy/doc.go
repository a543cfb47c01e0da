// Package deploy holds what runs nodepool in production: the Kubernetes
// manifests (a kustomization: nats/, nodepool/, keda/), the image tool
// (cmd/nodepool-image) and the test that decodes every manifest strictly
// into the Kubernetes and KEDA API types. It is a Go module of its own so
// that the main module does not depend on the Kubernetes libraries.
package deploy
