package main

import (
	"io"
	"log"
	"net"
	"net/http"
	"sort"
	"sync"
	"time"
)

// Go's net/http server reading one connection's bytes, for ["serve", raw]: what each handler saw
// and the bytes the server wrote back. The handler reads the whole body (as the apiserver's do)
// and answers 200 with no body.
var (
	serveOnce sync.Once
	serveAddr string
	seenMu    sync.Mutex
	seen      []map[string]any
)

func startServer() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	serveAddr = ln.Addr().String()
	srv := &http.Server{
		Handler:           http.HandlerFunc(record),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          log.New(io.Discard, "", 0),
		// The handler records OPTIONS * too (Go answers it itself by default).
		DisableGeneralOptionsHandler: true,
	}
	go func() { _ = srv.Serve(ln) }()
}

func record(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	bodyErr := ""
	if err != nil {
		bodyErr = err.Error()
	}
	keys := make([]string, 0, len(r.Header))
	for k := range r.Header {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	header := [][2]any{}
	for _, k := range keys {
		vs := [][]byte{}
		for _, v := range r.Header[k] {
			vs = append(vs, []byte(v))
		}
		header = append(header, [2]any{[]byte(k), vs})
	}
	entry := map[string]any{
		"method": []byte(r.Method), "uri": []byte(r.RequestURI), "host": []byte(r.Host),
		"major": r.ProtoMajor, "minor": r.ProtoMinor, "header": header, "body": body, "bodyErr": bodyErr,
	}
	seenMu.Lock()
	seen = append(seen, entry)
	seenMu.Unlock()
	w.WriteHeader(http.StatusOK)
}

func serve(raw []byte) map[string]any {
	serveOnce.Do(startServer)
	conn, err := net.Dial("tcp", serveAddr)
	if err != nil {
		panic(err)
	}
	_, _ = conn.Write(raw)
	_ = conn.(*net.TCPConn).CloseWrite()
	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	response, _ := io.ReadAll(conn)
	_ = conn.Close()
	seenMu.Lock()
	requests := seen
	seen = nil
	seenMu.Unlock()
	if requests == nil {
		requests = []map[string]any{}
	}
	return map[string]any{"requests": requests, "response": response}
}
