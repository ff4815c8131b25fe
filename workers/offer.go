package workers

// Offer holds body, the request of key's claim at epoch at that this node stored in REQUESTS,
// for this pool's worker that takes the claim's job (handle), which then need not read it back:
// a body-sized read and two body-sized copies (the server's load and its answer) fewer per
// large request whose job runs where it was admitted, which on one node is every one. The
// bytes are the ones the admitting handler holds anyway. withdraw ends the offer (the
// admission is over); a job taken after that, or on another node, reads REQUESTS.
func (p *Pool) Offer(key string, at int, body []byte) (withdraw func()) {
	k := offerKey{key, at}
	p.offers.Store(k, body)
	return func() { p.offers.Delete(k) }
}

// offered takes the request offered for key's claim at epoch at, once.
func (p *Pool) offered(key string, at int) ([]byte, bool) {
	v, ok := p.offers.LoadAndDelete(offerKey{key, at})
	if !ok {
		return nil, false
	}
	return v.([]byte), true
}

type offerKey struct {
	key string
	at  int
}
