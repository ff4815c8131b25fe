package gateway

import (
	"testing"
	"time"

	"github.com/oncegate/oncegate/kv"
)

// TestHorizonCoversTheRestartSweep: the ledger's id index spans the records a restarted
// worker's charge sweep repeats (kv.BillableWindow) plus the ledger's minute for clocks, so
// none of those charges reads the stream to find out whether it exists.
func TestHorizonCoversTheRestartSweep(t *testing.T) {
	const clockMargin = time.Minute // ledger's
	if dedupHorizon <= kv.BillableWindow+clockMargin {
		t.Fatalf("dedupHorizon %s does not exceed kv.BillableWindow %s plus the ledger's %s for clocks", dedupHorizon, kv.BillableWindow, clockMargin)
	}
}
