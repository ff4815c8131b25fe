package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"
)

const keyAdminUsage = `usage: oncegate key add --tenant TENANT [--url URL]
       oncegate key revoke [--url URL] HASH|KEY|-
       oncegate key list [--url URL] [--json]
  Manage tenants' API keys at run time, through a running gateway's admin API
  (/v1/admin/keys); every node takes a change into account within a second.
  add     makes a new key (32 random bytes), stores its SHA-256 for TENANT (a configured
          tenants[].id) and prints the key once on stdout: it is stored nowhere else.
  revoke  refuses a key from now on, on every node: its hash (64 hex digits), the key itself,
          or - to read the key from stdin (out of the shell history). A key of the
          configuration can be revoked too.
  list    every key's hash, tenant, source (runtime or config), created and revoked times.
  The admin key is read from ONCEGATE_ADMIN_KEY (admin.api_keys_sha256 holds its hash); URL
  defaults to ONCEGATE_URL, else http://127.0.0.1:8080.
`

// errKeyUsage: the command line is wrong (exit 2, with the usage).
var errKeyUsage = errors.New("usage")

// isKeyAdminCommand reports whether `oncegate key SUB` is one of the admin API's commands.
func isKeyAdminCommand(sub string) bool {
	return sub == "add" || sub == "revoke" || sub == "list"
}

// keyAdminMain is `oncegate key add|revoke|list`.
func keyAdminMain(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) int {
	sub, args := args[0], args[1:]
	fs := flag.NewFlagSet("key "+sub, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	base := fs.String("url", "", "the gateway's URL")
	var tenant *string
	var asJSON *bool
	switch sub {
	case "add":
		tenant = fs.String("tenant", "", "the tenant")
	case "list":
		asJSON = fs.Bool("json", false, "print the API's JSON")
	}
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "oncegate key %s: %s\n%s", sub, fmt.Sprintf(format, a...), keyAdminUsage)
		return 2
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			io.WriteString(stdout, keyAdminUsage)
			return 0
		}
		return fail("%v", err)
	}
	cl, err := newKeyClient(*base, getenv)
	if err != nil {
		return fail("%v", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	switch sub {
	case "add":
		if *tenant == "" || fs.NArg() != 0 {
			return fail("give --tenant TENANT and nothing else")
		}
		err = keyAdd(ctx, cl, *tenant, stdout, stderr)
	case "revoke":
		if fs.NArg() != 1 {
			return fail("give one key hash, key, or - (the key on stdin)")
		}
		var hash string
		if hash, err = revokedHash(fs.Arg(0), stdin); err == nil {
			err = keyRevoke(ctx, cl, hash, stdout)
		}
	case "list":
		if fs.NArg() != 0 {
			return fail("list takes no arguments")
		}
		err = keyList(ctx, cl, *asJSON, stdout)
	}
	if errors.Is(err, errKeyUsage) {
		return fail("%s", strings.TrimPrefix(err.Error(), errKeyUsage.Error()+": "))
	}
	if err != nil {
		fmt.Fprintf(stderr, "oncegate key %s: %v\n", sub, err)
		return 1
	}
	return 0
}

// keyClient calls a gateway's key admin API.
type keyClient struct {
	base     string
	adminKey string
	http     *http.Client
}

func newKeyClient(base string, getenv func(string) string) (*keyClient, error) {
	if base == "" {
		base = getenv("ONCEGATE_URL")
	}
	if base == "" {
		base = "http://127.0.0.1:8080"
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--url %q is not an http(s) URL", base)
	}
	admin := strings.TrimSpace(getenv("ONCEGATE_ADMIN_KEY"))
	if admin == "" {
		return nil, errors.New("set ONCEGATE_ADMIN_KEY to an admin key (its hash is in admin.api_keys_sha256)")
	}
	return &keyClient{base: strings.TrimSuffix(base, "/"), adminKey: admin, http: &http.Client{}}, nil
}

// do sends one request and decodes a 2xx answer's JSON into out; any other answer is an
// error that quotes the gateway's message.
func (k *keyClient) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	// The operator names the gateway to manage (--url); asking it is the command's job.
	req, err := http.NewRequestWithContext(ctx, method, k.base+path, rd) // #nosec G704 -- the operator's own gateway URL
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+k.adminKey)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := k.http.Do(req) // #nosec G704 -- the operator's own gateway URL
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		var e struct {
			Error struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		msg := strings.TrimSpace(string(data))
		if json.Unmarshal(data, &e) == nil && e.Error.Message != "" {
			msg = e.Error.Message
		}
		if resp.StatusCode == http.StatusNotFound && path == "/v1/admin/keys" {
			msg += " (the gateway's admin API is off: configure admin.api_keys_sha256)"
		}
		return fmt.Errorf("%s %s: %d: %s", method, path, resp.StatusCode, msg)
	}
	return json.Unmarshal(data, out)
}

// keyView is one key as the admin API shows it.
type keyView struct {
	Hash    string    `json:"sha256"`
	Tenant  string    `json:"tenant"`
	Source  string    `json:"source"`
	Created time.Time `json:"created,omitzero"`
	Revoked time.Time `json:"revoked,omitzero"`
}

// newAPIKey is a fresh key: "og-" and 32 bytes from crypto/rand, base64url.
func newAPIKey() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return "og-" + base64.RawURLEncoding.EncodeToString(b), nil
}

func hashOf(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

func keyAdd(ctx context.Context, cl *keyClient, tenant string, stdout, stderr io.Writer) error {
	key, err := newAPIKey()
	if err != nil {
		return err
	}
	var got keyView
	if err := cl.do(ctx, http.MethodPost, "/v1/admin/keys", map[string]string{"tenant": tenant, "sha256": hashOf(key)}, &got); err != nil {
		return err
	}
	fmt.Fprintln(stdout, key)
	fmt.Fprintf(stderr, "stored sha256 %s for tenant %s; the key above is shown this once\n", got.Hash, got.Tenant)
	return nil
}

// revokedHash is the hash an argument of `key revoke` names: a hash as it is, a key hashed,
// or "-": the key read from stdin.
func revokedHash(arg string, stdin io.Reader) (string, error) {
	if arg == "-" {
		b, err := io.ReadAll(io.LimitReader(stdin, maxKeyBytes+1))
		if err != nil {
			return "", err
		}
		if len(b) > maxKeyBytes {
			return "", fmt.Errorf("%w: stdin holds more than %d bytes: give one key", errKeyUsage, maxKeyBytes)
		}
		arg = string(b)
	}
	arg = strings.TrimSpace(arg)
	if arg == "" {
		return "", fmt.Errorf("%w: the key is empty", errKeyUsage)
	}
	if _, err := hex.DecodeString(arg); err == nil && len(arg) == 2*sha256.Size {
		return strings.ToLower(arg), nil
	}
	return hashOf(arg), nil
}

func keyRevoke(ctx context.Context, cl *keyClient, hash string, stdout io.Writer) error {
	var got keyView
	if err := cl.do(ctx, http.MethodDelete, "/v1/admin/keys/"+hash, nil, &got); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "revoked %s (tenant %s, %s) at %s\n", got.Hash, got.Tenant, got.Source, got.Revoked.UTC().Format(time.RFC3339))
	return nil
}

func keyList(ctx context.Context, cl *keyClient, asJSON bool, stdout io.Writer) error {
	var got struct {
		Data []keyView `json:"data"`
	}
	if err := cl.do(ctx, http.MethodGet, "/v1/admin/keys", nil, &got); err != nil {
		return err
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(got.Data)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SHA256\tTENANT\tSOURCE\tCREATED\tREVOKED")
	stamp := func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format(time.RFC3339)
	}
	for _, k := range got.Data {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", k.Hash, k.Tenant, k.Source, stamp(k.Created), stamp(k.Revoked))
	}
	return tw.Flush()
}
