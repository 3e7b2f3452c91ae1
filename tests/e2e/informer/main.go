// Command informer is a client-go shared informer on pods (or, with -resource GROUP/VERSION/RESOURCE, on any
// resource through the dynamic client, or its metadata alone through the metadata client with -metadata), used by kproxy's e2e tests to prove that a real controller keeps a
// correct local copy through kproxy (apiserver restarts, etcd compaction, discovery blips).
//
// It prints one JSON line per thing it sees on stdout:
//
//	{"kind":"list","mode":"list"|"watchlist","resourceVersion":...}   every (re)list the reflector makes
//	{"kind":"watch","resourceVersion":...,"sendInitialEvents":bool}   every watch it opens
//	{"kind":"event","type":"ADDED"|"MODIFIED"|"DELETED","namespace":...,"name":...,"resourceVersion":...,
//	 "goType":"*v1.Pod"|...,"labels":{...}}
//	{"kind":"bookmark","resourceVersion":...,"initialEventsEnd":bool}
//	{"kind":"watch-error-event","code":410,"reason":"Expired","message":...}   an ERROR event on a watch
//	{"kind":"watch-error","error":...}                                       the WatchErrorHandler's error
//	{"kind":"synced"}                                                          the informer has synced
//	{"kind":"store","resourceVersion":...,"objects":{"ns/name":"rv",...}}     on "dump" (stdin) or SIGUSR1
//	{"kind":"event-write","verb":"create","reason":...,"error":...,"statusError":bool,"dropped":bool}
//	    every write client-go's event recorder makes for an "event <reason>" command (stdin)
//
// "event <reason>" records an event on a pod reference with client-go's own event recorder
// (tools/record), as every controller does; its writes are reported as they happen. A write that fails
// with a *errors.StatusError is dropped by the recorder ("Server rejected event (will not retry!)"); any
// other failure is tried again after -event-retry-sleep (client-go's default is 10 s), 12 times at most.
//
// With WatchListClient on (client-go's default), a relist is a watch with sendInitialEvents=true, so both
// kinds of list are reported as "list" lines: a correct run has exactly one.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
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
	o, err := meta.Accessor(obj)
	if err != nil {
		emit(map[string]any{"kind": "unexpected-object", "type": kind, "object": fmt.Sprintf("%T", obj)})
		return
	}
	emit(map[string]any{
		"kind": "event", "type": kind, "namespace": o.GetNamespace(), "name": o.GetName(),
		"resourceVersion": o.GetResourceVersion(), "goType": fmt.Sprintf("%T", obj), "labels": o.GetLabels(),
	})
}

// resourceListWatch lists and watches -resource (GROUP/VERSION/RESOURCE) through the dynamic client,
// or with -metadata through the metadata client (PartialObjectMetadata, as the garbage collector's
// and the quota controller's informers do).
func resourceListWatch(cfg *rest.Config, namespace, resource string, metadataOnly bool) (
	func(context.Context, metav1.ListOptions) (runtime.Object, error),
	func(context.Context, metav1.ListOptions) (watch.Interface, error),
	runtime.Object,
	error,
) {
	parts := strings.Split(resource, "/")
	if len(parts) != 3 {
		return nil, nil, nil, fmt.Errorf("-resource %q: want GROUP/VERSION/RESOURCE", resource)
	}
	gvr := schema.GroupVersionResource{Group: parts[0], Version: parts[1], Resource: parts[2]}
	if metadataOnly {
		client, err := metadata.NewForConfig(cfg)
		if err != nil {
			return nil, nil, nil, err
		}
		ri := client.Resource(gvr).Namespace(namespace)
		list := func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return ri.List(ctx, o) }
		return list, ri.Watch, &metav1.PartialObjectMetadata{}, nil
	}
	client, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, nil, nil, err
	}
	ri := client.Resource(gvr).Namespace(namespace)
	list := func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return ri.List(ctx, o) }
	return list, ri.Watch, &unstructured.Unstructured{}, nil
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
		if o, err := meta.Accessor(e.Object); err == nil {
			emit(map[string]any{
				"kind": "bookmark", "resourceVersion": o.GetResourceVersion(),
				"initialEventsEnd": o.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true",
			})
		}
	}
	return e, true
}

// reportingSink is the recorder's real sink (the Events API) with each write reported; the recorder's
// retry and drop decisions (tools/record/event.go recordEvent) are client-go's own, taken on the
// error this returns unchanged.
type reportingSink struct{ inner record.EventSink }

func (s reportingSink) report(verb string, event *corev1.Event, err error) {
	line := map[string]any{"kind": "event-write", "verb": verb, "reason": event.Reason, "name": event.Name}
	if err != nil {
		var status *apierrors.StatusError
		isStatus := errors.As(err, &status)
		line["error"], line["statusError"] = err.Error(), isStatus
		// What recordEvent does with it: a StatusError is given up ("will not retry!").
		line["dropped"] = isStatus
	}
	emit(line)
}

func (s reportingSink) Create(event *corev1.Event) (*corev1.Event, error) {
	out, err := s.inner.Create(event)
	s.report("create", event, err)
	return out, err
}

func (s reportingSink) Update(event *corev1.Event) (*corev1.Event, error) {
	out, err := s.inner.Update(event)
	s.report("update", event, err)
	return out, err
}

func (s reportingSink) Patch(event *corev1.Event, data []byte) (*corev1.Event, error) {
	out, err := s.inner.Patch(event, data)
	s.report("patch", event, err)
	return out, err
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file")
	namespace := flag.String("namespace", "", "namespace to watch (empty: all namespaces)")
	resource := flag.String("resource", "", "GROUP/VERSION/RESOURCE to inform on through the dynamic client (empty: pods)")
	metadataOnly := flag.Bool("metadata", false, "with -resource: inform on its objects' metadata alone (the metadata client)")
	eventRetrySleep := flag.Duration("event-retry-sleep", 10*time.Second, "the event recorder's sleep between tries")
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
	listFn := func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return pods.List(ctx, o) }
	watchFn, example := pods.Watch, runtime.Object(&corev1.Pod{})
	if *resource != "" {
		listFn, watchFn, example, err = resourceListWatch(cfg, *namespace, *resource, *metadataOnly)
		if err != nil {
			emit(map[string]any{"kind": "fatal", "error": err.Error()})
			os.Exit(2)
		}
	}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			emit(map[string]any{"kind": "list", "mode": "list", "resourceVersion": opts.ResourceVersion})
			return listFn(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			initial := opts.SendInitialEvents != nil && *opts.SendInitialEvents
			if initial {
				emit(map[string]any{"kind": "list", "mode": "watchlist", "resourceVersion": opts.ResourceVersion})
			}
			emit(map[string]any{"kind": "watch", "resourceVersion": opts.ResourceVersion, "sendInitialEvents": initial})
			w, err := watchFn(ctx, opts)
			if err != nil {
				emit(map[string]any{"kind": "watch-open-error", "error": err.Error()})
				return nil, err
			}
			return watch.Filter(w, func(e watch.Event) (watch.Event, bool) {
				if ctx.Err() != nil { // stopping: the stream ends with the signal's cause, not a server's error
					return e, true
				}
				return observe(e)
			}), nil
		},
	}
	informer := cache.NewSharedIndexInformer(lw, example, 0, cache.Indexers{})
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
	broadcaster := record.NewBroadcaster(record.WithContext(ctx), record.WithSleepDuration(*eventRetrySleep))
	defer broadcaster.Shutdown()
	broadcaster.StartRecordingToSink(reportingSink{&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")}})
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "kproxy-informer"})
	eventNamespace := *namespace
	if eventNamespace == "" {
		eventNamespace = metav1.NamespaceDefault
	}
	subject := &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: eventNamespace, Name: "informer-events"}
	dump := func() {
		objects := map[string]string{}
		for _, obj := range informer.GetStore().List() {
			if o, err := meta.Accessor(obj); err == nil {
				objects[o.GetNamespace()+"/"+o.GetName()] = o.GetResourceVersion()
			}
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
			switch verb, arg, _ := strings.Cut(cmd, " "); {
			case verb == "event" && arg != "":
				recorder.Event(subject, corev1.EventTypeNormal, arg, "recorded by the informer test program")
			case cmd == "dump":
				dump()
			case cmd == "quit":
				return
			default:
				emit(map[string]any{"kind": "unknown-command", "command": cmd})
			}
		}
	}
}
