// Package e2e holds end-to-end tests of a whole oncegate gateway: a real embedded
// nats-server, the workers, the built-in mock backend and the HTTP API on 127.0.0.1, driven
// over HTTP and through the official OpenAI Go SDK. It has no non-test code.
package e2e
