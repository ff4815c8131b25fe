package telemetry

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// names bounds one label: a configured name maps to its index, anything else to fallback's.
type names struct {
	byName   map[string]int
	values   []string
	fallback int
}

// newNames is the label values of configured (deduplicated, empty names dropped) plus
// fallback, which is also the value of anything not configured.
func newNames(configured []string, fallback string) names {
	n := names{byName: map[string]int{}}
	for _, v := range append(configured, fallback) {
		if _, ok := n.byName[v]; ok || v == "" {
			continue
		}
		n.byName[v] = len(n.values)
		n.values = append(n.values, v)
	}
	n.fallback = n.byName[fallback]
	return n
}

func (n names) index(v string) int {
	if i, ok := n.byName[v]; ok {
		return i
	}
	return n.fallback
}

// cells resolves each label set of a vector once: the child of label indexes (i0, i1, …) is
// made by WithLabelValues on first use and kept, so the request path neither formats label
// values nor hashes them. A series appears on the first use of its label set.
type cells[T any] struct {
	dims  [][]string
	with  func(...string) T
	cells []atomic.Pointer[T]
}

func newCells[T any](with func(...string) T, dims ...[]string) cells[T] {
	n := 1
	for _, d := range dims {
		n *= len(d)
	}
	return cells[T]{dims: dims, with: with, cells: make([]atomic.Pointer[T], n)}
}

// at is the child of the label indexes idx (one per dimension, each in range).
func (c *cells[T]) at(idx ...int) T {
	flat := 0
	for d, i := range idx {
		flat = flat*len(c.dims[d]) + i
	}
	if p := c.cells[flat].Load(); p != nil {
		return *p
	}
	lvs := make([]string, len(idx))
	for d, i := range idx {
		lvs[d] = c.dims[d][i]
	}
	v := c.with(lvs...) // two racing first uses get the same child
	c.cells[flat].Store(&v)
	return v
}

func counterVec(reg *prometheus.Registry, name, help string, labels []string, dims ...[]string) cells[prometheus.Counter] {
	v := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help}, labels)
	reg.MustRegister(v)
	return newCells(v.WithLabelValues, dims...)
}

func gaugeVec(reg *prometheus.Registry, name, help string, labels []string, dims ...[]string) cells[prometheus.Gauge] {
	v := prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: name, Help: help}, labels)
	reg.MustRegister(v)
	return newCells(v.WithLabelValues, dims...)
}

func histogramVec(reg *prometheus.Registry, name, help string, buckets []float64, labels []string, dims ...[]string) cells[prometheus.Observer] {
	v := prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: name, Help: help, Buckets: buckets}, labels)
	reg.MustRegister(v)
	return newCells(v.WithLabelValues, dims...)
}

func counter(reg *prometheus.Registry, name, help string) prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help})
	reg.MustRegister(c)
	return c
}
