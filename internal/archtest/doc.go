// Package archtest keeps the import graph honest: dependencies point one way
// (cmd → internal/gateway → httpapi, workers → jobs, kv → nats), and httpapi and workers never
// import each other. It has no non-test code.
package archtest
