// Package jsonscan checks that a document is valid JSON and finds the members of its top-level
// object without decoding anything. An LLM request is mostly one long string (the prompt); this
// package crosses strings in a tight loop over their bytes, where encoding/json runs its state
// machine once per byte, so a caller that needs two small fields of a large body (say "stream")
// pays one fast pass instead of encoding/json's validation and decoding passes.
//
// Object accepts exactly what encoding/json.Valid accepts (FuzzObject checks it). Canonical,
// which decides what a request is, is strict: it also refuses what JSON parsers read
// differently (RFC 8259 §4, §8; the I-JSON profile, RFC 7493) — a string that is not valid
// UTF-8 or holds a lone UTF-16 surrogate escape, an object with a duplicate key at any depth
// (one parser keeps the first, another the last: a fingerprint and a backend would read two
// requests), a number beyond float64. encoding/json accepts them; the providers refuse them.
// FuzzCanonical checks it against jsonref, the same rules built on encoding/json.
package jsonscan

import (
	"bytes"
	"errors"
	"fmt"
	"unicode/utf8"
)

// Sentinel errors.
var (
	// ErrSyntax is matched by the *SyntaxError returned for input that is not valid JSON.
	ErrSyntax = errors.New("jsonscan: invalid JSON")
	// ErrNotObject is returned for valid JSON whose top-level value is not an object.
	ErrNotObject = errors.New("jsonscan: not a JSON object")
	// ErrInvalidUTF8 is matched (with ErrSyntax) by Canonical's error for a string that is not
	// valid UTF-8 or holds a lone surrogate escape (\ud800 with no low surrogate after it, or a
	// low one alone).
	ErrInvalidUTF8 = errors.New("jsonscan: invalid UTF-8")
	// ErrDuplicateKey is matched (with ErrSyntax) by Canonical's error for an object with the
	// same key twice.
	ErrDuplicateKey = errors.New("jsonscan: duplicate object key")
	// ErrNumberRange is matched (with ErrSyntax) by Canonical's error for a number beyond
	// float64's range.
	ErrNumberRange = errors.New("jsonscan: number out of range")
)

// Member is one member of an object, as raw bytes of the input: Key is the string token,
// quotes included (escapes not decoded); Value is the value token, without surrounding space.
type Member struct {
	Key, Value []byte
}

// Name is the member's key, decoded (as encoding/json decodes it).
func (m Member) Name() string { return decodeString(m.Key) }

// maxDepth is encoding/json's nesting limit.
const maxDepth = 10000

// Object validates data as one JSON value surrounded by optional whitespace and, if it is an
// object, returns its members in input order (duplicates included). The slices alias data.
func Object(data []byte) ([]Member, error) {
	var members []Member
	err := scanTop(data, false, func(s *scanner) error {
		return s.eachMember(1, func(key []byte) error {
			start := s.pos
			if err := s.value(1); err != nil {
				return err
			}
			members = append(members, Member{Key: key, Value: s.data[start:s.pos]})
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	return members, nil
}

// scanTop scans data as one value with optional space around it, the value through object if
// it is an object (from its '{', at depth 1). Valid JSON that is not an object is ErrNotObject.
func scanTop(data []byte, strict bool, object func(s *scanner) error) error {
	s := &scanner{data: data, strict: strict}
	s.space()
	if s.pos >= len(data) {
		return s.fail("unexpected end of input")
	}
	isObject := data[s.pos] == '{'
	var err error
	if isObject {
		err = object(s)
	} else {
		err = s.value(0)
	}
	if err != nil {
		return err
	}
	s.space()
	if s.pos != len(data) {
		return s.fail("data after the top-level value")
	}
	if !isObject {
		return ErrNotObject
	}
	return nil
}

type scanner struct {
	data []byte
	pos  int
	// strict refuses invalid UTF-8, lone surrogate escapes and duplicate keys (Canonical).
	strict bool
	// escaped reports that the last string token str scanned has an escape or a character
	// encoding/json rewrites ('<', '>', '&', and in a strict scan U+2028, U+2029).
	escaped bool
	// keys holds, per nesting depth, the keys of the object a strict scan is in there.
	keys []keySet
	// spanMin > 0: canon writes a verbatim string token of at least spanMin bytes as a
	// reference into spans instead of its bytes (CanonicalSum).
	spanMin int
	spans   [][]byte
}

// SyntaxError says where and why a document is not valid JSON. It matches ErrSyntax (and Kind,
// when set), and its text names no package and quotes no input, so an API can pass it on to
// its client.
type SyntaxError struct {
	Offset int
	What   string
	Kind   error // ErrInvalidUTF8, ErrDuplicateKey, ErrNumberRange, or nil
}

func (e *SyntaxError) Error() string {
	return fmt.Sprintf("invalid JSON: %s at offset %d", e.What, e.Offset)
}

// Is makes a SyntaxError match ErrSyntax and its Kind.
func (e *SyntaxError) Is(target error) bool {
	return target == ErrSyntax || e.Kind != nil && target == e.Kind
}

func (s *scanner) fail(what string) error { return &SyntaxError{Offset: s.pos, What: what} }

func (s *scanner) failAs(kind error, what string) error {
	return &SyntaxError{Offset: s.pos, What: what, Kind: kind}
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func (s *scanner) space() {
	for s.pos < len(s.data) && isSpace(s.data[s.pos]) {
		s.pos++
	}
}

// value scans one value at s.pos (no leading space) at nesting depth.
func (s *scanner) value(depth int) error {
	if s.pos >= len(s.data) {
		return s.fail("unexpected end of input")
	}
	switch c := s.data[s.pos]; {
	case c == '{':
		return s.eachMember(depth+1, func([]byte) error { return s.value(depth + 1) })
	case c == '[':
		return s.eachElement(depth+1, func() error { return s.value(depth + 1) })
	case c == '"':
		return s.str()
	case c == '-' || c >= '0' && c <= '9':
		return s.number()
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	default:
		return s.fail(fmt.Sprintf("invalid character %q looking for a value", c))
	}
}

// eachMember scans the object at s.pos (its depth given), calling member with each key token;
// member scans the value, which starts at s.pos. In a strict scan a key the object already
// had is an error.
func (s *scanner) eachMember(depth int, member func(key []byte) error) error {
	if empty, err := s.open(depth, '}'); err != nil || empty {
		return err
	}
	if s.strict {
		for len(s.keys) <= depth {
			s.keys = append(s.keys, keySet{})
		}
		s.keys[depth].reset() // an object at this depth before this one is done
	}
	for {
		if s.pos >= len(s.data) || s.data[s.pos] != '"' {
			return s.fail("looking for an object key")
		}
		keyStart := s.pos
		if err := s.str(); err != nil {
			return err
		}
		key := s.data[keyStart:s.pos]
		if s.strict {
			name := key[1 : len(key)-1] // the decoded key: no escape, and UTF-8 was checked
			if s.escaped {
				name = []byte(decodeString(key))
			}
			if !s.keys[depth].add(name) { // s.keys is indexed anew: deeper objects may grow it
				s.pos = keyStart
				return s.failAs(ErrDuplicateKey, "duplicate object key")
			}
		}
		s.space()
		if s.pos >= len(s.data) || s.data[s.pos] != ':' {
			return s.fail("looking for ':' after an object key")
		}
		s.pos++
		s.space()
		if err := member(key); err != nil {
			return err
		}
		if done, err := s.next('}'); err != nil || done {
			return err
		}
	}
}

// smallObject is how many keys an object's new key is compared with one by one; past it the
// keys go in a map. Request objects are nearly all small; a map per object would allocate.
const smallObject = 16

// keySet is the keys of one object, to find a duplicate. The keys alias the input where they
// have no escape.
type keySet struct {
	list    [][]byte
	index   map[string]struct{}
	indexed bool // the keys are in index, not list
}

func (k *keySet) reset() {
	k.list = k.list[:0]
	if k.indexed {
		clear(k.index)
		k.indexed = false
	}
}

// add records key and reports whether it is new.
func (k *keySet) add(key []byte) bool {
	if k.indexed {
		if _, dup := k.index[string(key)]; dup {
			return false
		}
		k.index[string(key)] = struct{}{}
		return true
	}
	for _, o := range k.list {
		if bytes.Equal(o, key) {
			return false
		}
	}
	k.list = append(k.list, key)
	if len(k.list) > smallObject {
		if k.index == nil {
			k.index = make(map[string]struct{}, 4*smallObject)
		}
		for _, o := range k.list {
			k.index[string(o)] = struct{}{}
		}
		k.indexed = true
	}
	return true
}

// eachElement scans the array at s.pos (its depth given), calling element to scan each element.
func (s *scanner) eachElement(depth int, element func() error) error {
	if empty, err := s.open(depth, ']'); err != nil || empty {
		return err
	}
	for {
		if err := element(); err != nil {
			return err
		}
		if done, err := s.next(']'); err != nil || done {
			return err
		}
	}
}

// open consumes an object's or array's opening byte and the space after it; empty reports
// that the closing byte came next (and was consumed).
func (s *scanner) open(depth int, closing byte) (empty bool, err error) {
	if depth > maxDepth {
		return false, s.fail("exceeded max depth")
	}
	s.pos++
	s.space()
	if s.pos < len(s.data) && s.data[s.pos] == closing {
		s.pos++
		return true, nil
	}
	return false, nil
}

// next consumes what follows an element: a ',' and the space after it, or the closing byte
// (done).
func (s *scanner) next(closing byte) (done bool, err error) {
	s.space()
	if s.pos >= len(s.data) {
		return false, s.fail("unexpected end of input")
	}
	switch s.data[s.pos] {
	case ',':
		s.pos++
		s.space()
		return false, nil
	case closing:
		s.pos++
		return true, nil
	}
	return false, s.fail(fmt.Sprintf("looking for ',' or %q", closing))
}

// Byte classes inside a string (strClass).
const (
	plainByte   = iota // copied as it is by encoding/json too
	quoteByte          // '"': the end
	escapeByte         // '\\'
	controlByte        // below 0x20: invalid
	htmlByte           // '<', '>', '&': escaped by encoding/json
	highByte           // 0x80 and above: part of a UTF-8 sequence (checked in a strict scan)
)

var strClass = func() (t [256]uint8) {
	for c := range 0x20 {
		t[c] = controlByte
	}
	t['"'], t['\\'] = quoteByte, escapeByte
	t['<'], t['>'], t['&'] = htmlByte, htmlByte, htmlByte
	for c := 0x80; c < 0x100; c++ {
		t[c] = highByte
	}
	return t
}()

// str scans a string token: any byte from 0x20 up except '"' and '\', or an escape. A strict
// scan refuses invalid UTF-8 and lone surrogate escapes (encoding/json decodes both to
// U+FFFD). It records in s.escaped whether the token has an escape or a character
// encoding/json rewrites.
func (s *scanner) str() error {
	s.escaped = false
	i := s.pos + 1
	for i < len(s.data) {
		c := strClass[s.data[i]]
		if c == plainByte {
			i++
			continue
		}
		switch c {
		case quoteByte:
			s.pos = i + 1
			return nil
		case escapeByte:
			s.escaped = true
			if i+1 >= len(s.data) {
				s.pos = i
				return s.fail("unexpected end of input in a string escape")
			}
			switch s.data[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				n, err := s.unicodeEscape(i)
				if err != nil {
					return err
				}
				i += n
			default:
				s.pos = i
				return s.fail("invalid escape")
			}
		case controlByte:
			s.pos = i
			return s.fail("control character in a string")
		case htmlByte:
			s.escaped = true
			i++
		default: // highByte
			if !s.strict {
				i++
				continue
			}
			r, size := utf8.DecodeRune(s.data[i:])
			if r == utf8.RuneError && size == 1 {
				s.pos = i
				return s.failAs(ErrInvalidUTF8, "invalid UTF-8 in a string")
			}
			if r == '\u2028' || r == '\u2029' {
				s.escaped = true
			}
			i += size
		}
	}
	s.pos = i
	return s.fail("unexpected end of input in a string")
}

// unicodeEscape checks the \u escape at s.data[i:] and returns its length: 6, or 12 for a
// surrogate pair. A lone surrogate is refused: it encodes no character (no UTF-8 can hold it).
func (s *scanner) unicodeEscape(i int) (int, error) {
	r, ok := hex4(s.data, i+2)
	if !ok {
		s.pos = i
		return 0, s.fail("invalid \\u escape")
	}
	if !s.strict {
		return 6, nil
	}
	switch {
	case r >= 0xDC00 && r < 0xE000:
		s.pos = i
		return 0, s.failAs(ErrInvalidUTF8, "lone low surrogate in a \\u escape")
	case r >= 0xD800 && r < 0xDC00:
		if i+7 >= len(s.data) || s.data[i+6] != '\\' || s.data[i+7] != 'u' {
			s.pos = i
			return 0, s.failAs(ErrInvalidUTF8, "lone high surrogate in a \\u escape")
		}
		lo, ok := hex4(s.data, i+8)
		if !ok {
			s.pos = i + 6
			return 0, s.fail("invalid \\u escape")
		}
		if lo < 0xDC00 || lo >= 0xE000 {
			s.pos = i
			return 0, s.failAs(ErrInvalidUTF8, "lone high surrogate in a \\u escape")
		}
		return 12, nil
	}
	return 6, nil
}

// hex4 is the value of the four hex digits at d[i:], if there are four.
func hex4(d []byte, i int) (rune, bool) {
	if i+4 > len(d) {
		return 0, false
	}
	var r rune
	for _, h := range d[i : i+4] {
		var v byte
		switch {
		case h >= '0' && h <= '9':
			v = h - '0'
		case h >= 'a' && h <= 'f':
			v = h - 'a' + 10
		case h >= 'A' && h <= 'F':
			v = h - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(v)
	}
	return r, true
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// number scans -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (s *scanner) number() error {
	d, i := s.data, s.pos
	if d[i] == '-' {
		i++
	}
	switch {
	case i < len(d) && d[i] == '0':
		i++
	case i < len(d) && d[i] >= '1' && d[i] <= '9':
		for i < len(d) && isDigit(d[i]) {
			i++
		}
	default:
		s.pos = i
		return s.fail("invalid number")
	}
	var ok bool
	if i < len(d) && d[i] == '.' {
		if i, ok = digits(d, i+1); !ok {
			s.pos = i
			return s.fail("invalid number: digits expected after '.'")
		}
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		if i, ok = digits(d, i); !ok {
			s.pos = i
			return s.fail("invalid number: digits expected in the exponent")
		}
	}
	s.pos = i
	return nil
}

// digits skips the run of digits at d[i:]; ok reports that there was at least one.
func digits(d []byte, i int) (end int, ok bool) {
	start := i
	for i < len(d) && isDigit(d[i]) {
		i++
	}
	return i, i > start
}

func (s *scanner) literal(word string) error {
	if len(s.data)-s.pos < len(word) || string(s.data[s.pos:s.pos+len(word)]) != word {
		return s.fail("invalid literal")
	}
	s.pos += len(word)
	return nil
}
