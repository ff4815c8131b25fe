// Package archtest keeps the import graph honest. It states the intended house, floor by
// floor (cmd → gateway → httpapi, workers → intent → jobs, kv, ledger → dialects → internal
// leaves), and fails on any arrow that climbs, on rooms of one floor that import each other
// (httpapi and workers; kv, jobs and ledger), on a package nobody placed on a floor, and on
// non-test code that imports the test kit. It has no non-test code.
package archtest
