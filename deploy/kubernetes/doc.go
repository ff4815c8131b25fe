// Package kubernetes holds oncegate's Kubernetes manifests and the test that validates them
// offline: embedded/ (a StatefulSet of three nodes whose embedded NATS servers form one
// JetStream cluster), embedded-partitioned/ (six such nodes in two StatefulSets, one per
// partition, each partition's streams placed on its own three nodes) and external-nats/ (api
// and worker Deployments, scaled apart, on a NATS cluster from the official Helm chart). It
// is a module of its own so that the Kubernetes API types its test decodes into stay out of
// the gateway's go.mod; .ci/run tests it. It has no non-test code.
package kubernetes
