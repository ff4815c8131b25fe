// Package jsonref is the reference the fuzz targets hold jsonscan to: the same rules written
// the slow, obvious way on top of encoding/json, so that a fast-path mistake in jsonscan shows
// up as a difference. Tests only; nothing in the gateway imports it.
package jsonref

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// Valid reports why data is not JSON as jsonscan.Canonical accepts it, numbers' range aside
// (nil if it is): encoding/json's Valid, valid UTF-8, no lone surrogate escape, no duplicate
// key in any object.
func Valid(data []byte) error {
	switch {
	case !json.Valid(data):
		return errors.New("not valid JSON")
	case !utf8.Valid(data): // outside strings encoding/json already refused any non-ASCII byte
		return errors.New("invalid UTF-8")
	case loneSurrogate(data):
		return errors.New("lone surrogate escape")
	case duplicateKey(data):
		return errors.New("duplicate key")
	}
	return nil
}

// Canonical is the canonical form of the JSON object data: Valid, decoded into a map with
// UseNumber, leave's top-level keys removed, numbers rewritten by Number, encoded again. It
// also returns the decoded object (numbers as written).
func Canonical(data []byte, leave func(string) bool) ([]byte, map[string]any, error) {
	if err := Valid(data); err != nil {
		return nil, nil, err
	}
	obj, err := decodeObject(data)
	if err != nil {
		return nil, nil, err
	}
	out, _ := decodeObject(data) // a second copy, to rewrite
	for k := range out {
		if leave != nil && leave(k) {
			delete(out, k)
		}
	}
	if err := numbers(out); err != nil {
		return nil, nil, err
	}
	b, err := json.Marshal(out)
	return b, obj, err
}

// decodeObject decodes data, which must be one JSON object, with UseNumber.
func decodeObject(data []byte) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var obj map[string]any
	if err := dec.Decode(&obj); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("trailing data")
	}
	if obj == nil {
		return nil, errors.New("not an object")
	}
	return obj, nil
}

// numbers rewrites, in place, every json.Number under the object or array v by Number.
func numbers(v any) error {
	set := func(e any, put func(any)) error {
		if n, ok := e.(json.Number); ok {
			c, err := Number(n)
			put(c)
			return err
		}
		return numbers(e)
	}
	var err error
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			err = errors.Join(err, set(e, func(c any) { x[k] = c }))
		}
	case []any:
		for i, e := range x {
			err = errors.Join(err, set(e, func(c any) { x[i] = c }))
		}
	}
	return err
}

// Number is the canonical spelling of n: an integer literal as written ("-0" as "0"); any other
// number as the float64 it denotes, in integer digits when whole and below 2^53 in magnitude,
// else as encoding/json writes that float64. Beyond float64's range it is an error.
func Number(n json.Number) (json.Number, error) {
	f, err := strconv.ParseFloat(string(n), 64)
	if math.IsInf(f, 0) {
		return "", err
	}
	if !strings.ContainsAny(string(n), ".eE") {
		if n == "-0" {
			return "0", nil
		}
		return n, nil
	}
	if f == math.Trunc(f) && math.Abs(f) < 1<<53 {
		return json.Number(strconv.FormatInt(int64(f), 10)), nil
	}
	b, err := json.Marshal(f)
	return json.Number(b), err
}

// loneSurrogate reports whether valid JSON data has a \u escape of a UTF-16 surrogate that is
// not a high one followed by a low one. In valid JSON every backslash is in a string.
func loneSurrogate(data []byte) bool {
	hex := func(i int) rune {
		if i+4 > len(data) {
			return -1
		}
		v, err := strconv.ParseUint(string(data[i:i+4]), 16, 32)
		if err != nil {
			return -1
		}
		return rune(v)
	}
	for i := 0; i < len(data); i++ {
		if data[i] != '\\' {
			continue
		}
		if data[i+1] != 'u' {
			i++ // a two-byte escape, \\ included
			continue
		}
		r := hex(i + 2)
		if !utf16.IsSurrogate(r) {
			i += 5
			continue
		}
		if r >= 0xDC00 || i+7 >= len(data) || data[i+6] != '\\' || data[i+7] != 'u' {
			return true
		}
		if lo := hex(i + 8); lo < 0xDC00 || lo >= 0xE000 {
			return true
		}
		i += 11
	}
	return false
}

// duplicateKey reports whether valid JSON data has an object with one key twice, walking the
// tokens of encoding/json's Decoder.
func duplicateKey(data []byte) bool {
	type frame struct {
		keys    map[string]bool // nil for an array
		wantKey bool
	}
	var stack []*frame
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber() // a float64 token would end the walk at a number out of its range
	for {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if d, ok := tok.(json.Delim); ok {
			switch d {
			case '{', '[':
				if top != nil && top.keys != nil {
					top.wantKey = true // after this value, a key
				}
				f := &frame{wantKey: d == '{'}
				if d == '{' {
					f.keys = map[string]bool{}
				}
				stack = append(stack, f)
			default:
				stack = stack[:len(stack)-1]
			}
			continue
		}
		if top == nil || top.keys == nil {
			continue
		}
		if top.wantKey {
			k := tok.(string)
			if top.keys[k] {
				return true
			}
			top.keys[k], top.wantKey = true, false
		} else {
			top.wantKey = true
		}
	}
}
