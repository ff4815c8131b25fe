package jsonscan

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"unicode/utf8"
)

// Canonical appends to dst the canonical form of the JSON object data: what decoding data
// into a map[string]any (with UseNumber) and encoding that with json.Marshal gives — object
// keys sorted, the last of duplicate keys kept, no insignificant space, strings escaped as
// encoding/json escapes them, numbers as written — without the top-level members whose key
// leave reports. It also returns data's top-level members, the last of duplicate keys kept,
// by decoded key (values alias data).
//
// Strings are copied as they are whenever encoding/json would write them unchanged (no
// escape, no '<', '>' or '&', valid UTF-8 without U+2028 or U+2029), which is nearly always;
// otherwise they go through encoding/json. FuzzCanonical checks the output against
// encoding/json's.
func Canonical(dst, data []byte, leave func(key string) bool) ([]byte, map[string]json.RawMessage, error) {
	top := map[string]json.RawMessage{}
	err := scanTop(data, func(s *scanner) (err error) {
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
	slices.SortStableFunc(members, func(a, b canonMember) int { return strings.Compare(a.key, b.key) })
	dst = append(dst, '{')
	wrote := false
	for i, m := range members {
		if i+1 < len(members) && members[i+1].key == m.key {
			continue // a later duplicate replaces it
		}
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
		if !s.escaped && (!s.high || plainUTF8(tok[1:len(tok)-1])) {
			return append(dst, tok...), nil
		}
		return appendString(dst, decodeString(tok)), nil
	}
	if err := s.value(depth); err != nil { // a number or a literal: written as it is
		return dst, err
	}
	return append(dst, s.data[start:s.pos]...), nil
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
