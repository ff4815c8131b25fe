// Package ledgerkit is test support for the ledger's tamper tests: what someone who edited a
// ledger export would do to make its chain look whole again. Only tests import it.
package ledgerkit

import (
	"github.com/oncegate/oncegate/internal/partition"
	"github.com/oncegate/oncegate/ledger"
)

// Rechain recomputes the hashes of tenant's chains in es from index from on, as someone who
// edited an entry would: keyed under secret, unkeyed (SHA-256) when secret is nil. A tenant
// has one chain per partition (its entries' key hashes' partition); each is recomputed on its
// own. It changes es in place and returns it.
func Rechain(es []ledger.Entry, tenant string, from int, secret []byte) []ledger.Entry {
	prev := map[partition.P]string{}
	for i := range es {
		e := &es[i]
		if e.Tenant != tenant {
			continue
		}
		p := partition.OfKey(e.KeyHash)
		if i >= from {
			e.PrevHash = prev[p]
			if secret != nil {
				e.Hash = ledger.KeyedHashOf(secret, e)
			} else {
				e.Hash = ledger.HashOf(e)
			}
		}
		prev[p] = e.Hash
	}
	return es
}
