// dprelay runs NVIDIA's device plugin and relays what it advertises, as JSON on stdout.
//
// It plays only the kubelet's side of the device-plugin API: the Registration service the
// plugin registers with, then, for each registered resource, GetDevicePluginOptions and the
// first ListAndWatch answer (device IDs, health, topology). It decides nothing about what a
// node has: every resource name and device in its output comes from the plugin.
//
// With -allocate N it also asks the plugin to Allocate N of a resource's devices (and for its
// GetPreferredAllocation of N), and records the plugin's answer or refusal
// (failRequestsGreaterThanOne shows up here).
//
// The plugin always serves on /var/lib/kubelet/device-plugins/nvidia-<name>.sock, so the
// caller runs dprelay in a private mount namespace where -dir is that folder.
//
// How it knows the plugin has registered everything: the plugin starts its per-resource
// servers one after the other, each registering synchronously, and only then watches the
// kubelet socket's folder. After the first registration dprelay creates its socket anew; the
// plugin reacts to that (once all its resources are registered) by restarting and registering
// them again. The first resource registered twice closes the list.
//
//	dprelay -dir /var/lib/kubelet/device-plugins [-allocate 2] [-timeout 60s] -- nvidia-device-plugin ARGS...
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type device struct {
	ID       string  `json:"id"`
	Health   string  `json:"health"`
	NUMANode []int64 `json:"numaNodes,omitempty"`
}

type resource struct {
	Name      string                         `json:"name"`
	Endpoint  string                         `json:"endpoint"`
	Options   *pluginapi.DevicePluginOptions `json:"options,omitempty"`
	Devices   []device                       `json:"devices"`
	Preferred []string                       `json:"preferred,omitempty"`
	Allocate  *allocation                    `json:"allocate,omitempty"`
	Error     string                         `json:"error,omitempty"`
}

type allocation struct {
	Requested []string          `json:"requested"`
	Error     string            `json:"error,omitempty"`
	Envs      map[string]string `json:"envs,omitempty"`
	Devices   []string          `json:"deviceSpecs,omitempty"`
}

type result struct {
	Resources []*resource `json:"resources"`
	NoDevices bool        `json:"noDevices,omitempty"`
	Error     string      `json:"error,omitempty"`
	Log       []string    `json:"log,omitempty"`
}

type relay struct {
	pluginapi.UnimplementedRegistrationServer
	dir      string
	allocate int
	mu       sync.Mutex
	seen     map[string]bool
	res      []*resource
	first    chan struct{}
	done     chan struct{}
	once     sync.Once
	doneOnce sync.Once
}

func (r *relay) Register(ctx context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	r.mu.Lock()
	again := r.seen[req.ResourceName]
	r.seen[req.ResourceName] = true
	r.mu.Unlock()
	if again {
		r.doneOnce.Do(func() { close(r.done) })
		return &pluginapi.Empty{}, nil
	}
	res := r.read(ctx, req)
	r.mu.Lock()
	r.res = append(r.res, res)
	r.mu.Unlock()
	r.once.Do(func() { close(r.first) })
	return &pluginapi.Empty{}, nil
}

// read asks the plugin what it serves for one resource, as the kubelet would after Register.
func (r *relay) read(ctx context.Context, req *pluginapi.RegisterRequest) *resource {
	res := &resource{Name: req.ResourceName, Endpoint: req.Endpoint, Devices: []device{}}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+filepath.Join(r.dir, req.Endpoint),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		res.Error = err.Error()
		return res
	}
	defer conn.Close()
	client := pluginapi.NewDevicePluginClient(conn)
	if res.Options, err = client.GetDevicePluginOptions(ctx, &pluginapi.Empty{}); err != nil {
		res.Error = "GetDevicePluginOptions: " + err.Error()
		return res
	}
	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		res.Error = "ListAndWatch: " + err.Error()
		return res
	}
	list, err := stream.Recv()
	if err != nil {
		res.Error = "ListAndWatch: " + err.Error()
		return res
	}
	ids := []string{}
	for _, d := range list.Devices {
		dev := device{ID: d.ID, Health: d.Health}
		if d.Topology != nil {
			for _, n := range d.Topology.Nodes {
				dev.NUMANode = append(dev.NUMANode, n.ID)
			}
		}
		res.Devices = append(res.Devices, dev)
		ids = append(ids, d.ID)
	}
	if r.allocate > 0 && len(ids) >= r.allocate {
		if res.Options.GetPreferredAllocationAvailable {
			pref, err := client.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{
				ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
					AvailableDeviceIDs: ids, AllocationSize: int32(r.allocate)}}})
			if err == nil && len(pref.ContainerResponses) == 1 {
				res.Preferred = pref.ContainerResponses[0].DeviceIDs
			}
		}
		want := ids[:r.allocate]
		if len(res.Preferred) == r.allocate {
			want = res.Preferred
		}
		a := &allocation{Requested: want}
		resp, err := client.Allocate(ctx, &pluginapi.AllocateRequest{
			ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: want}}})
		if err != nil {
			a.Error = err.Error()
		} else if len(resp.ContainerResponses) == 1 {
			a.Envs = resp.ContainerResponses[0].Envs
			for _, s := range resp.ContainerResponses[0].Devices {
				a.Devices = append(a.Devices, s.HostPath)
			}
		}
		res.Allocate = a
	}
	return res
}

func main() {
	dir := flag.String("dir", pluginapi.DevicePluginPath, "the device-plugin folder (kubelet.sock is made here)")
	allocate := flag.Int("allocate", 0, "also ask each resource to Allocate this many devices (0: no)")
	timeout := flag.Duration("timeout", 60*time.Second, "give up after this long")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: dprelay [-dir D] [-allocate N] [-timeout T] -- nvidia-device-plugin ARGS...")
		os.Exit(2)
	}
	out := result{}
	emit := func(code int) {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(out)
		os.Exit(code)
	}
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		out.Error = err.Error()
		emit(1)
	}
	sock := filepath.Join(*dir, "kubelet.sock")
	r := &relay{dir: *dir, allocate: *allocate, seen: map[string]bool{},
		first: make(chan struct{}), done: make(chan struct{})}
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, r)
	listen := func() net.Listener {
		_ = os.Remove(sock)
		l, err := net.Listen("unix", sock)
		if err != nil {
			out.Error = "listen on " + sock + ": " + err.Error()
			emit(1)
		}
		go func() { _ = srv.Serve(l) }()
		return l
	}
	first := listen()

	cmd := exec.Command(flag.Arg(0), flag.Args()[1:]...)
	cmd.Env = os.Environ()
	stderr, _ := cmd.StderrPipe()
	cmd.Stdout = cmd.Stderr
	if err := cmd.Start(); err != nil {
		out.Error = "start " + flag.Arg(0) + ": " + err.Error()
		emit(1)
	}
	var logMu sync.Mutex
	noDevices := make(chan struct{})
	exited := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		closed := false
		for sc.Scan() {
			line := sc.Text()
			logMu.Lock()
			out.Log = append(out.Log, line)
			if len(out.Log) > 200 {
				out.Log = out.Log[len(out.Log)-200:]
			}
			logMu.Unlock()
			if !closed && strings.Contains(line, "No devices found") {
				closed = true
				close(noDevices)
			}
		}
		exited <- cmd.Wait()
	}()
	stop := func() {
		if cmd.Process != nil {
			_ = cmd.Process.Signal(os.Interrupt)
		}
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
		}
		srv.Stop()
		_ = os.Remove(sock)
	}
	deadline := time.After(*timeout)
	select {
	case <-r.first:
		// A new kubelet socket: the plugin re-registers once it has started all its resources.
		_ = first.Close()
		listen()
		select {
		case <-r.done:
		case err := <-exited:
			out.Error = fmt.Sprintf("the device plugin exited after registering: %v", err)
		case <-deadline:
			out.Error = fmt.Sprintf("the device plugin did not register again within %s", *timeout)
		}
	case <-noDevices:
		out.NoDevices = true
	case err := <-exited:
		out.Error = fmt.Sprintf("the device plugin exited before registering: %v", err)
	case <-deadline:
		out.Error = fmt.Sprintf("the device plugin registered nothing within %s", *timeout)
	}
	stop()
	r.mu.Lock()
	out.Resources = r.res
	r.mu.Unlock()
	if out.Error != "" {
		emit(1)
	}
	if out.Error == "" {
		logMu.Lock()
		out.Log = nil
		logMu.Unlock()
	}
	emit(0)
}
