// Command gooracle answers, line by line, how Go's own net/url reads what kproxy must read the
// same way: kproxy's tests send it hostile inputs and compare its answers with kproxy.gocompat.
//
// Each input line is a JSON array [kind, input]; each output line is a JSON object.
//
//	["requesturi", target]  url.ParseRequestURI: {"err": bool, "path", "rawQuery", "host", "scheme", "opaque"}
//	["query", rawQuery]     url.ParseQuery: {"err": bool, "values": [[key, [value, ...]], ...]} (keys sorted)
//
// An input whose bytes are not UTF-8 comes as [kind+"-latin1", one rune per byte].
// Strings that Go holds as bytes are written base64-encoded (JSON's []byte), so bytes that are not
// UTF-8 survive the trip.
package main

import (
	"bufio"
	"encoding/json"
	"net/url"
	"os"
	"sort"
	"strings"
)

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<26)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var req [2]string
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			panic(err)
		}
		kind, latin1 := strings.CutSuffix(req[0], "-latin1")
		if latin1 { // bytes that are not UTF-8 arrive as Latin-1 text: one rune per byte
			raw := make([]byte, 0, len(req[1]))
			for _, r := range req[1] {
				raw = append(raw, byte(r))
			}
			req[1] = string(raw)
		}
		switch kind {
		case "requesturi":
			u, err := url.ParseRequestURI(req[1])
			if err != nil {
				_ = out.Encode(map[string]any{"err": true})
				continue
			}
			_ = out.Encode(map[string]any{
				"err": false, "path": []byte(u.Path), "rawQuery": u.RawQuery, "host": []byte(u.Host),
				"scheme": u.Scheme, "opaque": u.Opaque,
			})
		case "query":
			values, err := url.ParseQuery(req[1])
			keys := make([]string, 0, len(values))
			for k := range values {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			pairs := [][2]any{}
			for _, k := range keys {
				vs := [][]byte{}
				for _, v := range values[k] {
					vs = append(vs, []byte(v))
				}
				pairs = append(pairs, [2]any{[]byte(k), vs})
			}
			_ = out.Encode(map[string]any{"err": err != nil, "values": pairs})
		default:
			panic("unknown kind " + req[0])
		}
	}
}
