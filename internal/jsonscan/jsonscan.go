// Package jsonscan checks that a document is valid JSON and finds the members of its top-level
// object without decoding anything. An LLM request is mostly one long string (the prompt); this
// package crosses strings in a tight loop over their bytes, where encoding/json runs its state
// machine once per byte, so a caller that needs two small fields of a large body (say "stream")
// pays one fast pass instead of encoding/json's validation and decoding passes.
//
// What it accepts is exactly what encoding/json.Valid accepts (FuzzObject checks it).
package jsonscan

import (
	"errors"
	"fmt"
)

// Sentinel errors.
var (
	// ErrSyntax is matched by the *SyntaxError returned for input that is not valid JSON.
	ErrSyntax = errors.New("jsonscan: invalid JSON")
	// ErrNotObject is returned for valid JSON whose top-level value is not an object.
	ErrNotObject = errors.New("jsonscan: not a JSON object")
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
	err := scanTop(data, func(s *scanner) error {
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
func scanTop(data []byte, object func(s *scanner) error) error {
	s := &scanner{data: data}
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
	// escaped and high describe the last string token str scanned.
	escaped, high bool
}

// SyntaxError says where and why a document is not valid JSON. It matches ErrSyntax, and its
// text names no package, so an API can pass it on to its client.
type SyntaxError struct {
	Offset int
	What   string
}

func (e *SyntaxError) Error() string {
	return fmt.Sprintf("invalid JSON: %s at offset %d", e.What, e.Offset)
}

// Is makes a SyntaxError match ErrSyntax.
func (e *SyntaxError) Is(target error) bool { return target == ErrSyntax }

func (s *scanner) fail(what string) error { return &SyntaxError{Offset: s.pos, What: what} }

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
// member scans the value, which starts at s.pos.
func (s *scanner) eachMember(depth int, member func(key []byte) error) error {
	if empty, err := s.open(depth, '}'); err != nil || empty {
		return err
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
	highByte           // 0x80 and above: part of a UTF-8 sequence (or not)
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

// str scans a string token: any byte from 0x20 up except '"' and '\', or an escape (as
// encoding/json, which does not check UTF-8 here either). It records in s.escaped whether the
// token has an escape or a byte encoding/json escapes for HTML, and in s.high whether it has a
// byte from 0x80 up.
func (s *scanner) str() error {
	s.escaped, s.high = false, false
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
				if i+6 > len(s.data) {
					s.pos = i
					return s.fail("unexpected end of input in a \\u escape")
				}
				for _, h := range s.data[i+2 : i+6] {
					if !isHex(h) {
						s.pos = i
						return s.fail("invalid \\u escape")
					}
				}
				i += 6
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
			s.high = true
			i++
		}
	}
	s.pos = i
	return s.fail("unexpected end of input in a string")
}

func isHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }

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
