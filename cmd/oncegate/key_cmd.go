package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"strings"
)

const keyUsage = `usage: oncegate key hash [KEY]
       oncegate key add|revoke|list ...   (keys managed at run time: oncegate key add -h)
  prints the hex SHA-256 of an API key, the value tenants[].api_keys_sha256 and
  admin.api_keys_sha256 (and ONCEGATE_TENANTS) expect. Without KEY it reads the key from
  stdin, which keeps it out of the shell history and the process list:
    printf %s "$KEY" | oncegate key hash
  Surrounding whitespace (the newline of echo) is not part of the key: the gateway trims it
  from the Authorization and x-api-key headers too.
`

// maxKeyBytes bounds what `key hash` reads from stdin: an API key, not a file.
const maxKeyBytes = 4096

// keyMain is `oncegate key hash [KEY]`. The key is never printed, only its hash.
func keyMain(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] != "hash" || len(args) > 2 {
		if len(args) == 1 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			io.WriteString(stdout, keyUsage)
			return 0
		}
		io.WriteString(stderr, keyUsage)
		return 2
	}
	var key string
	if len(args) == 2 {
		key = args[1]
	} else {
		b, err := io.ReadAll(io.LimitReader(stdin, maxKeyBytes+1))
		if err != nil {
			fmt.Fprintf(stderr, "oncegate key hash: read stdin: %v\n", err)
			return 1
		}
		if len(b) > maxKeyBytes {
			fmt.Fprintf(stderr, "oncegate key hash: stdin holds more than %d bytes: give one key\n", maxKeyBytes)
			return 2
		}
		key = string(b)
	}
	// As the gateway reads it: the Bearer value is trimmed, and HTTP strips the spaces
	// around any header value.
	key = strings.TrimSpace(key)
	if key == "" {
		fmt.Fprint(stderr, "oncegate key hash: the key is empty\n")
		return 2
	}
	if strings.ContainsAny(key, "\r\n") {
		fmt.Fprint(stderr, "oncegate key hash: the key holds a line break: give one key (an HTTP header cannot carry it)\n")
		return 2
	}
	sum := sha256.Sum256([]byte(key))
	fmt.Fprintln(stdout, hex.EncodeToString(sum[:]))
	return 0
}
