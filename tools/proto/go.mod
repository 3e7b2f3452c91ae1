// The Kubernetes API schema kproxy's protobuf codec is built from: `go mod download` fetches
// these modules (same release as the local control plane, tools/envtest/go.mod) from the Go
// module proxy; build.sh compiles their generated.proto files and reads their Go json tags.
module kproxy.local/proto

go 1.26.0

require (
	k8s.io/api v0.37.1
	k8s.io/apiextensions-apiserver v0.37.1
	k8s.io/apimachinery v0.37.1
	k8s.io/kube-aggregator v0.37.1
)
