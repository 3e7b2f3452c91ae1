// Command standin-kubelet serves the kubelet's streaming endpoints (exec, attach,
// port-forward) with the kubelet's own streaming code (k8s.io/cri-streaming), so
// that a real kube-apiserver can proxy `kubectl exec`, `attach` and `port-forward`
// to it when no kubelet or container runtime is running.
//
// A "container" is the local machine: exec runs the command as a local process,
// attach runs a fixed command per container name (-attach NAME=COMMAND, default
// `cat`), and port-forward connects to 127.0.0.1:<port asked>. It serves HTTPS
// with a self-signed certificate made at start (the apiserver does not verify
// kubelet certificates unless --kubelet-certificate-authority is set) and prints
// "listening on 127.0.0.1:PORT" on stdout once it accepts connections.
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/cri-streaming/pkg/streaming/portforward"
	"k8s.io/cri-streaming/pkg/streaming/remotecommand"
	utilexec "k8s.io/utils/exec"
)

const (
	idleTimeout           = 4 * time.Hour // the kubelet's StreamingConnectionIdleTimeout default
	streamCreationTimeout = remotecommand.DefaultStreamCreationTimeout
)

type attachFlag map[string]string

func (a attachFlag) String() string { return fmt.Sprint(map[string]string(a)) }

func (a attachFlag) Set(v string) error {
	name, cmd, ok := strings.Cut(v, "=")
	if !ok || name == "" || cmd == "" {
		return fmt.Errorf("want NAME=COMMAND, got %q", v)
	}
	a[name] = cmd
	return nil
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to serve HTTPS on")
	attach := attachFlag{}
	flag.Var(attach, "attach", "NAME=COMMAND: the shell command `kubectl attach` to container NAME reaches (repeatable; default cat)")
	flag.Parse()

	cert, err := selfSigned()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	rt := &runtime{attach: attach}
	srv := &http.Server{
		Handler:   routes(rt),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}},
	}
	fmt.Printf("listening on %s\n", ln.Addr())
	if err := srv.ServeTLS(ln, "", ""); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// routes are the kubelet's URL shapes (pkg/kubelet/server/server.go), with and without the pod UID.
func routes(rt *runtime) http.Handler {
	mux := http.NewServeMux()
	for _, m := range []string{"GET", "POST"} {
		for _, p := range []string{"/{ns}/{pod}/{container}", "/{ns}/{pod}/{uid}/{container}"} {
			mux.HandleFunc(m+" /exec"+p, rt.serveExec)
			mux.HandleFunc(m+" /attach"+p, rt.serveAttach)
		}
		mux.HandleFunc(m+" /portForward/{ns}/{pod}", rt.servePortForward)
		mux.HandleFunc(m+" /portForward/{ns}/{pod}/{uid}", rt.servePortForward)
	}
	return mux
}

func (rt *runtime) serveExec(w http.ResponseWriter, req *http.Request) {
	opts, err := remotecommand.NewOptions(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	cmd := req.URL.Query()["command"]
	remotecommand.ServeExec(w, req, rt, podName(req), req.PathValue("uid"), req.PathValue("container"), cmd, opts,
		idleTimeout, streamCreationTimeout, remotecommand.SupportedStreamingProtocols)
}

func (rt *runtime) serveAttach(w http.ResponseWriter, req *http.Request) {
	opts, err := remotecommand.NewOptions(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	remotecommand.ServeAttach(w, req, rt, podName(req), req.PathValue("uid"), req.PathValue("container"), opts,
		idleTimeout, streamCreationTimeout, remotecommand.SupportedStreamingProtocols)
}

func (rt *runtime) servePortForward(w http.ResponseWriter, req *http.Request) {
	opts, err := portforward.NewV4Options(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	portforward.ServePortForward(w, req, rt, podName(req), req.PathValue("uid"), opts,
		idleTimeout, streamCreationTimeout, portforward.SupportedProtocols)
}

func podName(req *http.Request) string { return req.PathValue("ns") + "/" + req.PathValue("pod") }

// runtime is the container runtime of the stand-in: local processes and local ports.
type runtime struct {
	attach map[string]string
}

func (rt *runtime) ExecInContainer(ctx context.Context, _, _, _ string, cmd []string, in io.Reader, out, errw io.WriteCloser,
	tty bool, resize <-chan remotecommand.TerminalSize, _ time.Duration) error {
	if len(cmd) == 0 {
		return errors.New("no command given")
	}
	return run(ctx, exec.CommandContext(ctx, cmd[0], cmd[1:]...), in, out, errw, tty, resize)
}

func (rt *runtime) AttachContainer(ctx context.Context, _, _, container string, in io.Reader, out, errw io.WriteCloser,
	tty bool, resize <-chan remotecommand.TerminalSize) error {
	script, ok := rt.attach[container]
	if !ok {
		script = "cat"
	}
	return run(ctx, exec.CommandContext(ctx, "sh", "-c", script), in, out, errw, tty, resize)
}

func (rt *runtime) PortForward(ctx context.Context, _, _ string, port int32, stream io.ReadWriteCloser) error {
	defer stream.Close()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return err
	}
	defer conn.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(conn, stream); _ = conn.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
	go func() { _, _ = io.Copy(stream, conn); done <- struct{}{} }()
	<-done
	<-done
	return nil
}

// run runs a process with the session's streams; a non-zero exit is returned as the
// utilexec.ExitError the kubelet reports as NonZeroExitCode (so kubectl exits with it).
func run(ctx context.Context, c *exec.Cmd, in io.Reader, out, errw io.WriteCloser, tty bool, resize <-chan remotecommand.TerminalSize) error {
	c.Env = append(os.Environ(), "TERM=xterm")
	if tty {
		return runTTY(ctx, c, in, out, resize)
	}
	if in != nil {
		// Not c.Stdin = in: Wait would then wait for the client to close stdin even after the
		// process has exited; a runtime reports the exit as soon as the process is gone.
		w, err := c.StdinPipe()
		if err != nil {
			return err
		}
		go func() { _, _ = io.Copy(w, in); _ = w.Close() }()
	}
	if out != nil {
		c.Stdout = out
	}
	if errw != nil {
		c.Stderr = errw
	}
	return exitError(c.Run())
}

func runTTY(_ context.Context, c *exec.Cmd, in io.Reader, out io.WriteCloser, resize <-chan remotecommand.TerminalSize) error {
	ptm, pts, err := openPTY()
	if err != nil {
		return err
	}
	defer ptm.Close()
	c.Stdin, c.Stdout, c.Stderr = pts, pts, pts
	c.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true}
	if err := c.Start(); err != nil {
		pts.Close()
		return err
	}
	pts.Close()
	go func() {
		for size := range resize {
			_ = unix.IoctlSetWinsize(int(ptm.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: size.Height, Col: size.Width})
		}
	}()
	if in != nil {
		go func() { _, _ = io.Copy(ptm, in) }()
	}
	var wg sync.WaitGroup
	if out != nil {
		wg.Add(1)
		go func() { defer wg.Done(); _, _ = io.Copy(out, ptm) }() // ends with EIO once the process is gone
	}
	err = c.Wait()
	wg.Wait()
	return exitError(err)
}

func exitError(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return &utilexec.ExitErrorWrapper{ExitError: ee}
	}
	return err
}

func openPTY() (*os.File, *os.File, error) {
	ptm, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, err
	}
	fd := int(ptm.Fd())
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		ptm.Close()
		return nil, nil, err
	}
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	if err != nil {
		ptm.Close()
		return nil, nil, err
	}
	pts, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		ptm.Close()
		return nil, nil, err
	}
	return ptm, pts, nil
}

func selfSigned() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "standin-kubelet"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
