package jsonscan

import (
	"bytes"
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Canonical appends to dst the canonical form of the JSON object data — object keys sorted, no
// insignificant space, strings escaped as encoding/json escapes them, numbers in one spelling
// per value (canonNumber) — without the top-level members whose key leave reports. It also
// returns data's top-level members by decoded key (values alias data). It refuses what the
// scanner refuses (duplicate keys, invalid UTF-8, lone surrogates) and numbers beyond float64.
//
// Strings are copied as they are whenever encoding/json would write them unchanged (no
// escape, no '<', '>' or '&', no U+2028 or U+2029), which is nearly always; otherwise they go
// through encoding/json. FuzzCanonical checks the output against jsonref's, which is
// encoding/json's with the numbers rewritten.
func Canonical(dst, data []byte, leave func(key string) bool) ([]byte, map[string]json.RawMessage, error) {
	top := map[string]json.RawMessage{}
	err := scanTop(data, true, func(s *scanner) (err error) {
		dst, err = s.canonObject(dst, 1, leave, top)
		return err
	})
	if err != nil {
		return dst, nil, err
	}
	return dst, top, nil
}

type canonMember struct {
	key string
	val []byte
}

// canonObject writes the object at s.pos in canonical form; top, when not nil, gets its raw
// members by key.
func (s *scanner) canonObject(dst []byte, depth int, leave func(string) bool, top map[string]json.RawMessage) ([]byte, error) {
	var members []canonMember
	err := s.eachMember(depth, func(keyTok []byte) error {
		key, start := decodeString(keyTok), s.pos
		val, err := s.canon(nil, depth)
		if err != nil {
			return err
		}
		if top != nil {
			top[key] = s.data[start:s.pos]
		}
		members = append(members, canonMember{key: key, val: val})
		return nil
	})
	if err != nil {
		return dst, err
	}
	slices.SortFunc(members, func(a, b canonMember) int { return strings.Compare(a.key, b.key) }) // keys are unique
	dst = append(dst, '{')
	wrote := false
	for _, m := range members {
		if leave != nil && leave(m.key) {
			continue
		}
		if wrote {
			dst = append(dst, ',')
		}
		wrote = true
		dst = appendString(dst, m.key)
		dst = append(dst, ':')
		dst = append(dst, m.val...)
	}
	return append(dst, '}'), nil
}

// canon writes the value at s.pos in canonical form.
func (s *scanner) canon(dst []byte, depth int) ([]byte, error) {
	if s.pos >= len(s.data) {
		return dst, s.fail("unexpected end of input")
	}
	start := s.pos
	switch s.data[s.pos] {
	case '{':
		return s.canonObject(dst, depth+1, nil, nil)
	case '[':
		dst = append(dst, '[')
		first := true
		err := s.eachElement(depth+1, func() (err error) {
			if !first {
				dst = append(dst, ',')
			}
			first = false
			dst, err = s.canon(dst, depth+1)
			return err
		})
		if err != nil {
			return dst, err
		}
		return append(dst, ']'), nil
	case '"':
		if err := s.str(); err != nil {
			return dst, err
		}
		tok := s.data[start:s.pos]
		if !s.escaped {
			return append(dst, tok...), nil
		}
		return appendString(dst, decodeString(tok)), nil
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		if err := s.number(); err != nil {
			return dst, err
		}
		return s.canonNumber(dst, start)
	}
	if err := s.value(depth); err != nil { // a literal: written as it is
		return dst, err
	}
	return append(dst, s.data[start:s.pos]...), nil
}

// canonNumber writes the number token data[start:s.pos] in one spelling per value, so that
// 0.5, 0.50 and 5e-1 (or 1, 1.0 and 1e0) are one intent. An integer written without fraction
// or exponent stays as written ("-0" is "0"), exact at any size: a parser that keeps integers
// (Python's) reads a seed past 2^53 exactly, and rounding it would merge two requests. Any
// other number is the float64 it denotes (what every provider's parser reads): integer digits
// when it is a whole number below 2^53 in magnitude, else as encoding/json writes a float64
// (the shortest digits that read back to it). A number beyond float64's range is refused.
func (s *scanner) canonNumber(dst []byte, start int) ([]byte, error) {
	tok := s.data[start:s.pos]
	f, _ := strconv.ParseFloat(string(tok), 64) // the token was scanned: only a range error is left
	if math.IsInf(f, 0) {
		s.pos = start
		return dst, s.failAs(ErrNumberRange, "number out of range")
	}
	if bytes.IndexAny(tok, ".eE") < 0 {
		if string(tok) == "-0" {
			return append(dst, '0'), nil
		}
		return append(dst, tok...), nil
	}
	if f == math.Trunc(f) && math.Abs(f) < 1<<53 {
		return strconv.AppendInt(dst, int64(f), 10), nil
	}
	return appendFloat(dst, f), nil
}

// appendFloat writes f as encoding/json writes a float64 (ES6 number formatting).
func appendFloat(dst []byte, f float64) []byte {
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	dst = strconv.AppendFloat(dst, f, format, -1, 64)
	if n := len(dst); format == 'e' && n >= 4 && dst[n-4] == 'e' && dst[n-3] == '-' && dst[n-2] == '0' {
		dst[n-2] = dst[n-1] // e-07 is written e-7
		dst = dst[:n-1]
	}
	return dst
}

// plain reports whether encoding/json writes the string whose (undecoded) content is b as b:
// no escape, no character it escapes for HTML, valid UTF-8 without U+2028 and U+2029.
func plain(b []byte) bool {
	high := false
	for _, c := range b {
		switch strClass[c] {
		case plainByte:
		case highByte:
			high = true
		default:
			return false
		}
	}
	return !high || plainUTF8(b)
}

// plainUTF8 reports whether encoding/json writes the non-ASCII bytes of b unchanged.
func plainUTF8(b []byte) bool {
	return utf8.Valid(b) && !bytes.Contains(b, []byte("\u2028")) && !bytes.Contains(b, []byte("\u2029"))
}

// decodeString decodes a valid string token.
func decodeString(tok []byte) string {
	if body := tok[1 : len(tok)-1]; bytes.IndexByte(body, '\\') < 0 && utf8.Valid(body) {
		return string(body)
	}
	var s string
	_ = json.Unmarshal(tok, &s) // cannot fail: the token was scanned
	return s
}

// appendString writes s as encoding/json does.
func appendString(dst []byte, s string) []byte {
	if plain([]byte(s)) {
		dst = append(dst, '"')
		dst = append(dst, s...)
		return append(dst, '"')
	}
	b, _ := json.Marshal(s) // a string always encodes
	return append(dst, b...)
}
