package kv_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/oncegate/oncegate/kv"
)

// TestEncodeDecode: a record round-trips with its request stored after the JSON, byte for byte
// (newlines and spacing included), and version 1 records (request inside the JSON) still decode.
func TestEncodeDecode(t *testing.T) {
	created := time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name    string
		request string
	}{
		{"no request", ""},
		{"compact", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`},
		{"pretty, with newlines", "{\n  \"model\": \"m\",\n  \"messages\": [{\"role\": \"user\", \"content\": \"a\\nb\"}]\n}\n"},
		{"large", `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 1<<16) + `"}]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &kv.Record{State: kv.Pending, Tenant: "t\nwith a newline", JobID: "J", Epoch: 2, Fingerprint: "fp", Created: created, Request: json.RawMessage(tc.request)}
			data, err := kv.Encode(rec)
			if err != nil {
				t.Fatal(err)
			}
			got, err := kv.Decode(data)
			if err != nil {
				t.Fatal(err)
			}
			if string(got.Request) != tc.request || got.Tenant != rec.Tenant || got.Epoch != 2 || !got.Created.Equal(created) || got.V != 2 {
				t.Fatalf("round trip: %+v", got)
			}
			if tc.request != "" && !bytes.HasSuffix(data, []byte(tc.request)) {
				t.Fatal("the request is not stored as sent")
			}
		})
	}
	t.Run("version 1", func(t *testing.T) {
		got, err := kv.Decode([]byte(`{"v":1,"state":"PENDING","tenant":"t","job_id":"J","epoch":1,"fp":"fp","owner":"o","created":"2026-11-29T08:00:00Z","epoch_started":"2026-11-29T08:00:00Z","model":"m","backend":"","stream":false,"request":{"model":"m","messages":[]}}`))
		if err != nil || string(got.Request) != `{"model":"m","messages":[]}` || got.State != kv.Pending {
			t.Fatalf("version 1 record: %+v, %v", got, err)
		}
	})
	for name, data := range map[string]string{
		"version 1 with bytes after it": `{"v":1,"state":"PENDING"}` + "\n{}",
		"not JSON":                      "\n{}",
		"empty":                         "",
	} {
		t.Run(name, func(t *testing.T) {
			if rec, err := kv.Decode([]byte(data)); err == nil {
				t.Fatalf("decoded %+v, want an error", rec)
			}
		})
	}
}

// FuzzRecordRequest: any request bytes round-trip through Encode and Decode unchanged.
func FuzzRecordRequest(f *testing.F) {
	f.Add([]byte(`{"model":"m"}`), "tenant")
	f.Add([]byte("\n\n{}\n"), "a\nb")
	f.Add([]byte{}, "")
	f.Fuzz(func(t *testing.T, request []byte, tenant string) {
		rec := &kv.Record{State: kv.Pending, Tenant: tenant, Request: request}
		data, err := kv.Encode(rec)
		if err != nil {
			t.Fatalf("encode: %v", err) // strings, ints and bytes always marshal
		}
		got, err := kv.Decode(data)
		if err != nil {
			t.Fatalf("decode of an encoded record: %v", err)
		}
		if !bytes.Equal(got.Request, request) {
			t.Fatalf("request %q came back as %q", request, got.Request)
		}
	})
}
