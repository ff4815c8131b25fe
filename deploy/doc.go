// Package deploy holds what an operator deploys beside oncegate, and the tests that keep it
// true: prometheus/alerts.yml (recording and alerting rules, unit-tested by
// prometheus/alerts_test.yml through promtool) and grafana/oncegate.json (a dashboard whose
// every metric name a running gateway must export). Its tests also keep the repository's
// Dockerfile true (its rules; with buildah, a real build whose image is run) and the
// Kubernetes manifests under kubernetes/. It has no non-test code.
package deploy
