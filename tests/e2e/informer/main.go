// Command informer is a client-go shared informer on pods, used by kproxy's e2e tests to prove that a real
// controller keeps a correct local copy through kproxy (apiserver restarts, etcd compaction).
//
// It prints one JSON line per thing it sees on stdout:
//
//	{"kind":"list","mode":"list"|"watchlist","resourceVersion":...}   every (re)list the reflector makes
//	{"kind":"watch","resourceVersion":...,"sendInitialEvents":bool}   every watch it opens
//	{"kind":"event","type":"ADDED"|"MODIFIED"|"DELETED","namespace":...,"name":...,"resourceVersion":...}
//	{"kind":"bookmark","resourceVersion":...,"initialEventsEnd":bool}
//	{"kind":"watch-error-event","code":410,"reason":"Expired","message":...}   an ERROR event on a watch
//	{"kind":"watch-error","error":...}                                       the WatchErrorHandler's error
//	{"kind":"synced"}                                                          the informer has synced
//	{"kind":"store","resourceVersion":...,"objects":{"ns/name":"rv",...}}     on "dump" (stdin) or SIGUSR1
//
// With WatchListClient on (client-go's default), a relist is a watch with sendInitialEvents=true, so both
// kinds of list are reported as "list" lines: a correct run has exactly one.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

var out = struct {
	sync.Mutex
	enc *json.Encoder
}{enc: json.NewEncoder(os.Stdout)}

// emit writes one JSON line; stdout is unbuffered, so the test sees each line as it happens.
func emit(v map[string]any) {
	out.Lock()
	defer out.Unlock()
	if err := out.enc.Encode(v); err != nil {
		os.Exit(3)
	}
}

func podEvent(kind string, obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		emit(map[string]any{"kind": "unexpected-object", "type": kind, "object": fmt.Sprintf("%T", obj)})
		return
	}
	emit(map[string]any{
		"kind": "event", "type": kind, "namespace": pod.Namespace, "name": pod.Name,
		"resourceVersion": pod.ResourceVersion,
	})
}

// observe reports ERROR and BOOKMARK events before the reflector sees them (a 410 during a watch never
// reaches the WatchErrorHandler: the reflector just relists).
func observe(e watch.Event) (watch.Event, bool) {
	switch e.Type {
	case watch.Error:
		line := map[string]any{"kind": "watch-error-event"}
		if st, ok := e.Object.(*metav1.Status); ok {
			line["code"], line["reason"], line["message"] = st.Code, string(st.Reason), st.Message
		} else {
			line["object"] = fmt.Sprintf("%T", e.Object)
		}
		emit(line)
	case watch.Bookmark:
		if pod, ok := e.Object.(*corev1.Pod); ok {
			emit(map[string]any{
				"kind": "bookmark", "resourceVersion": pod.ResourceVersion,
				"initialEventsEnd": pod.Annotations[metav1.InitialEventsAnnotationKey] == "true",
			})
		}
	}
	return e, true
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file")
	namespace := flag.String("namespace", "", "namespace to watch (empty: all namespaces)")
	flag.Parse()

	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		emit(map[string]any{"kind": "fatal", "error": err.Error()})
		os.Exit(2)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		emit(map[string]any{"kind": "fatal", "error": err.Error()})
		os.Exit(2)
	}
	pods := client.CoreV1().Pods(*namespace)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			emit(map[string]any{"kind": "list", "mode": "list", "resourceVersion": opts.ResourceVersion})
			return pods.List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			initial := opts.SendInitialEvents != nil && *opts.SendInitialEvents
			if initial {
				emit(map[string]any{"kind": "list", "mode": "watchlist", "resourceVersion": opts.ResourceVersion})
			}
			emit(map[string]any{"kind": "watch", "resourceVersion": opts.ResourceVersion, "sendInitialEvents": initial})
			w, err := pods.Watch(ctx, opts)
			if err != nil {
				emit(map[string]any{"kind": "watch-open-error", "error": err.Error()})
				return nil, err
			}
			return watch.Filter(w, observe), nil
		},
	}
	informer := cache.NewSharedIndexInformer(lw, &corev1.Pod{}, 0, cache.Indexers{})
	if err := informer.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		emit(map[string]any{"kind": "watch-error", "error": err.Error()})
	}); err != nil {
		emit(map[string]any{"kind": "fatal", "error": err.Error()})
		os.Exit(2)
	}
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { podEvent("ADDED", obj) },
		UpdateFunc: func(_, obj any) { podEvent("MODIFIED", obj) },
		DeleteFunc: func(obj any) { podEvent("DELETED", obj) },
	}); err != nil {
		emit(map[string]any{"kind": "fatal", "error": err.Error()})
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	dump := func() {
		objects := map[string]string{}
		for _, obj := range informer.GetStore().List() {
			pod := obj.(*corev1.Pod)
			objects[pod.Namespace+"/"+pod.Name] = pod.ResourceVersion
		}
		emit(map[string]any{"kind": "store", "resourceVersion": informer.LastSyncResourceVersion(), "objects": objects})
	}
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	commands := make(chan string)
	go func() {
		scanner := bufio.NewScanner(os.Stdin)
		for scanner.Scan() {
			commands <- scanner.Text()
		}
		close(commands) // stdin closed: the test is gone
	}()

	go informer.RunWithContext(ctx)
	go func() {
		if cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
			emit(map[string]any{"kind": "synced"})
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-usr1:
			dump()
		case cmd, ok := <-commands:
			if !ok {
				return
			}
			switch cmd {
			case "dump":
				dump()
			case "quit":
				return
			default:
				emit(map[string]any{"kind": "unknown-command", "command": cmd})
			}
		}
	}
}
