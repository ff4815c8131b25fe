// Package docs is the documentation (README.md and docs/**/*.md) and the tests that keep it
// true: every relative link and #anchor resolves, the HTTP API page names every route and
// error code of the code, and the troubleshooting page names every start-up failure. The
// pages that are generated (configuration.md, cli.md) are checked by their generators' golden
// tests, and the pages whose commands are run (getting-started.md, operations/cluster.md) by
// e2e's README tests. The package has no code beyond its tests.
package docs
