package telemetry

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// MoneyRow is one tenant's and model's money counters of this process (the dashboard's).
type MoneyRow struct {
	Tenant, Model            string
	SpendMicros, SavedMicros int64
	Joined, Replayed         int64
}

// MoneyRows are the non-zero tenant × model rows of spend, savings and executions avoided,
// read from the counters themselves (no scrape): for the built-in dashboard, which shows the
// same numbers /metrics exports.
func (m *Metrics) MoneyRows() []MoneyRow {
	if m == nil {
		return nil
	}
	type tm struct{ t, md int }
	rows := map[tm]*MoneyRow{}
	row := func(t, md int) *MoneyRow {
		r := rows[tm{t, md}]
		if r == nil {
			r = &MoneyRow{Tenant: m.tenants.values[t], Model: m.models.values[md]}
			rows[tm{t, md}] = r
		}
		return r
	}
	m.spend.each(func(idx []int, v int64) { row(idx[0], idx[1]).SpendMicros += v })
	m.saved.each(func(idx []int, v int64) { row(idx[0], idx[1]).SavedMicros += v })
	m.avoided.each(func(idx []int, v int64) {
		if idx[2] == howJoined {
			row(idx[0], idx[1]).Joined += v
		} else {
			row(idx[0], idx[1]).Replayed += v
		}
	})
	out := make([]MoneyRow, 0, len(rows))
	for _, r := range rows {
		if r.SpendMicros != 0 || r.SavedMicros != 0 || r.Joined != 0 || r.Replayed != 0 {
			out = append(out, *r)
		}
	}
	return out
}

// Reversals are the ledger reversals of this process per tenant (non-zero only).
func (m *Metrics) Reversals() map[string]int64 {
	if m == nil {
		return nil
	}
	out := map[string]int64{}
	m.reversals.each(func(idx []int, v int64) { out[m.tenants.values[idx[0]]] += v })
	return out
}

// each calls f with the label indexes and value of every non-zero series of c made so far.
func (c *cells[T]) each(f func(idx []int, v int64)) {
	idx := make([]int, len(c.dims))
	for flat := range c.cells {
		p := c.cells[flat].Load()
		if p == nil {
			continue
		}
		mt, ok := any(*p).(prometheus.Metric)
		if !ok {
			continue
		}
		var d dto.Metric
		if mt.Write(&d) != nil {
			continue
		}
		v := int64(d.GetCounter().GetValue() + d.GetGauge().GetValue())
		if v == 0 {
			continue
		}
		rest := flat
		for i := len(c.dims) - 1; i >= 0; i-- {
			idx[i] = rest % len(c.dims[i])
			rest /= len(c.dims[i])
		}
		f(idx, v)
	}
}
