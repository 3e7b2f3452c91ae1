// Command gooracle answers, line by line, how Go itself (the standard library, and the apiserver's
// own packages) reads what kproxy must read the same way: kproxy's tests send it hostile inputs and
// compare its answers with kproxy.gocompat.
//
// Each input line is a JSON array [kind, arg, ...]; each output line is a JSON object.
//
//	["requesturi", target]  url.ParseRequestURI: {"err": bool, "path", "rawQuery", "host", "scheme", "opaque"}
//	["query", rawQuery]     url.ParseQuery: {"err": bool, "values": [[key, [value, ...]], ...]} (keys sorted)
//	["trimspace", s]        strings.TrimSpace: {"out"}
//	["tolower", s]          strings.ToLower: {"out"}
//	["equalfold", s, t]     strings.EqualFold: {"eq": bool}
//	["split", s, sep]       strings.Split: {"out": [...]}
//	["rawurl", s]           base64.RawURLEncoding.DecodeString: {"err": bool, "out"}
//	["containstoken", token, value, ...]
//	                        httpguts.HeaderValuesContainsToken(values, token): {"in": bool}
//	["mediatype", v]        mime.ParseMediaType (how the apiserver reads Content-Type): {"err": bool, "type"}
//	["yamltojson", doc]     sigs.k8s.io/yaml YAMLToJSON (how the apiserver reads a YAML body): {"err": bool, "json"}
//	["yamlstring", s]       sigs.k8s.io/yaml Marshal of {"v": s} (how the apiserver writes a string in YAML): {"out"}
//	["serve", raw]          Go's net/http server reading raw as one connection's bytes (serve.go):
//	                        {"requests": [{"method", "uri", "host", "major", "minor", "header":
//	                        [[name, [value, ...]], ...], "body", "bodyErr"}, ...], "response": the bytes
//	                        it wrote}
//	["unicode"]             the unicode tables: {"space": [r...], "lower": [[r, l]...], "fold": [[r, f]...]}
//	                        (unicode.IsSpace; unicode.ToLower and unicode.SimpleFold where they differ from r)
//	["request", name, value, name, value, ...]
//	                        a request with these header lines (http.Header.Add, as Go's server reads
//	                        them), given to the apiserver's own code: {"websocket":
//	                        wsstream.IsWebSocketRequest, "upgrade": httpstream.IsUpgradeRequest,
//	                        "bearer": bearertoken.Authenticator's result, "protocol":
//	                        websocket.ProtocolAuthenticator's, "union": both in the apiserver's union},
//	                        each result {"ok": bool, "err": bool, "token", "protocols": [...] | null}
//	                        with a token authenticator that accepts every token not starting "bad"
//	                        and echoes it as the user name; "protocols" is Sec-WebSocket-Protocol after.
//
// An input whose bytes are not UTF-8 comes as [kind+"-latin1", ...] with one rune per byte in every arg.
// Strings that Go holds as bytes are written base64-encoded (JSON's []byte), so bytes that are not
// UTF-8 survive the trip.
package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"mime"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strings"
	"unicode"

	"golang.org/x/net/http/httpguts"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/request/bearertoken"
	"k8s.io/apiserver/pkg/authentication/request/union"
	"k8s.io/apiserver/pkg/authentication/request/websocket"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/streaming/pkg/httpstream"
	"k8s.io/streaming/pkg/httpstream/wsstream"
	"sigs.k8s.io/yaml"
)

// echo accepts every token that does not start with "bad"; the user's name is the token.
type echo struct{}

func (echo) AuthenticateToken(_ context.Context, token string) (*authenticator.Response, bool, error) {
	if strings.HasPrefix(token, "bad") {
		return nil, false, nil
	}
	return &authenticator.Response{User: &user.DefaultInfo{Name: token}}, true, nil
}

func newRequest(args []string) *http.Request {
	req := &http.Request{Method: "GET", Header: http.Header{}}
	for i := 0; i+1 < len(args); i += 2 {
		req.Header.Add(args[i], args[i+1])
	}
	return req
}

func result(req *http.Request, a authenticator.Request) map[string]any {
	resp, ok, err := a.AuthenticateRequest(req)
	out := map[string]any{"ok": ok, "err": err != nil, "token": []byte(nil), "protocols": nil}
	if ok {
		out["token"] = []byte(resp.User.GetName())
	}
	if v, found := req.Header["Sec-Websocket-Protocol"]; found {
		ps := [][]byte{}
		for _, p := range v {
			ps = append(ps, []byte(p))
		}
		out["protocols"] = ps
	}
	return out
}

func unicodeTables() map[string]any {
	space, lower, fold := []rune{}, [][2]rune{}, [][2]rune{}
	for r := rune(0); r <= unicode.MaxRune; r++ {
		if unicode.IsSpace(r) {
			space = append(space, r)
		}
		if l := unicode.ToLower(r); l != r {
			lower = append(lower, [2]rune{r, l})
		}
		if f := unicode.SimpleFold(r); f != r {
			fold = append(fold, [2]rune{r, f})
		}
	}
	return map[string]any{"space": space, "lower": lower, "fold": fold}
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<26)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var req []string
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			panic(err)
		}
		kind, latin1 := strings.CutSuffix(req[0], "-latin1")
		args := req[1:]
		if latin1 { // bytes that are not UTF-8 arrive as Latin-1 text: one rune per byte
			for i, arg := range args {
				raw := make([]byte, 0, len(arg))
				for _, r := range arg {
					raw = append(raw, byte(r))
				}
				args[i] = string(raw)
			}
		}
		switch kind {
		case "requesturi":
			u, err := url.ParseRequestURI(args[0])
			if err != nil {
				_ = out.Encode(map[string]any{"err": true})
				continue
			}
			_ = out.Encode(map[string]any{
				"err": false, "path": []byte(u.Path), "rawQuery": u.RawQuery, "host": []byte(u.Host),
				"scheme": u.Scheme, "opaque": u.Opaque,
			})
		case "query":
			values, err := url.ParseQuery(args[0])
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
		case "trimspace":
			_ = out.Encode(map[string]any{"out": []byte(strings.TrimSpace(args[0]))})
		case "tolower":
			_ = out.Encode(map[string]any{"out": []byte(strings.ToLower(args[0]))})
		case "equalfold":
			_ = out.Encode(map[string]any{"eq": strings.EqualFold(args[0], args[1])})
		case "split":
			parts := [][]byte{}
			for _, p := range strings.Split(args[0], args[1]) {
				parts = append(parts, []byte(p))
			}
			_ = out.Encode(map[string]any{"out": parts})
		case "rawurl":
			decoded, err := base64.RawURLEncoding.DecodeString(args[0])
			_ = out.Encode(map[string]any{"err": err != nil, "out": decoded})
		case "containstoken":
			_ = out.Encode(map[string]any{"in": httpguts.HeaderValuesContainsToken(args[1:], args[0])})
		case "mediatype":
			mt, _, err := mime.ParseMediaType(args[0])
			_ = out.Encode(map[string]any{"err": err != nil, "type": []byte(mt)})
		case "yamltojson":
			j, err := yaml.YAMLToJSON([]byte(args[0]))
			_ = out.Encode(map[string]any{"err": err != nil, "json": j})
		case "yamlstring":
			y, err := yaml.Marshal(map[string]string{"v": args[0]})
			if err != nil {
				panic(err)
			}
			_ = out.Encode(map[string]any{"out": y})
		case "unicode":
			_ = out.Encode(unicodeTables())
		case "serve":
			_ = out.Encode(serve([]byte(args[0])))
		case "request":
			r := newRequest(args)
			_ = out.Encode(map[string]any{
				"websocket": wsstream.IsWebSocketRequest(r),
				"upgrade":   httpstream.IsUpgradeRequest(r),
				"bearer":    result(newRequest(args), bearertoken.New(echo{})),
				"protocol":  result(newRequest(args), websocket.NewProtocolAuthenticator(echo{})),
				"union": result(newRequest(args), union.New(
					bearertoken.New(echo{}), websocket.NewProtocolAuthenticator(echo{}))),
			})
		default:
			panic("unknown kind " + req[0])
		}
	}
}
