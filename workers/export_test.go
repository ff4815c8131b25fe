package workers

// WithoutHeartbeat makes p keep no job message in progress, as when its acks are lost (a
// partition): JOBS then redelivers its jobs after the ack wait while it still runs them.
func WithoutHeartbeat(p *Pool) *Pool {
	p.noHeartbeat = true
	return p
}
