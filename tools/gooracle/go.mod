module kproxy.local/gooracle

go 1.26.0

require (
	golang.org/x/net v0.57.0
	k8s.io/apiserver v0.37.1
	k8s.io/streaming v0.37.1
	sigs.k8s.io/yaml v1.6.0
)

require (
	github.com/go-logr/logr v1.4.3 // indirect
	go.yaml.in/yaml/v2 v2.4.4 // indirect
	golang.org/x/text v0.40.0 // indirect
	k8s.io/apimachinery v0.37.1 // indirect
	k8s.io/klog/v2 v2.140.0 // indirect
)
