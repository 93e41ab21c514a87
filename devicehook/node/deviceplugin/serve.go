package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Run serves the plugin socket, registers with the kubelet and keeps doing
// so: when the kubelet restarts it deletes every plugin socket and creates
// a new kubelet.sock, and Run then serves and registers again. It returns
// when ctx ends, removing its socket.
func (p *Plugin) Run(ctx context.Context) error {
	sock := filepath.Join(p.cfg.PluginDir, p.cfg.SocketName)
	kubeletSock := filepath.Join(p.cfg.PluginDir, filepath.Base(pluginapi.KubeletSocket))
	backoff := p.cfg.PollInterval
	for {
		srv, err := p.serve(sock)
		if err == nil {
			err = p.register(ctx, kubeletSock)
			if err != nil {
				srv.Stop()
			}
		}
		if err != nil {
			klog.ErrorS(err, "device plugin not registered; retrying", "resource", p.cfg.ResourceName, "in", backoff)
			select {
			case <-ctx.Done():
				_ = os.Remove(sock)
				return nil
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 30*time.Second)
			continue
		}
		backoff = p.cfg.PollInterval
		klog.InfoS("device plugin registered", "resource", p.cfg.ResourceName, "socket", sock)
		ours, kubelet := inode(sock), inode(kubeletSock)
		why := p.watch(ctx, sock, kubeletSock, ours, kubelet)
		srv.Stop()
		if why == "" {
			_ = os.Remove(sock)
			return nil
		}
		klog.InfoS("re-registering device plugin", "resource", p.cfg.ResourceName, "reason", why)
	}
}

// watch returns "" when ctx ends, or why the plugin must re-register.
func (p *Plugin) watch(ctx context.Context, sock, kubeletSock string, ours, kubelet uint64) string {
	t := time.NewTicker(p.cfg.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ""
		case <-t.C:
		}
		switch now := inode(sock); {
		case now == 0:
			return "plugin socket removed (kubelet restarted)"
		case now != ours:
			return "plugin socket replaced"
		}
		if now := inode(kubeletSock); now != 0 && now != kubelet {
			return "kubelet socket recreated (kubelet restarted)"
		}
	}
}

func inode(path string) uint64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 1
}

func (p *Plugin) serve(sock string) (*grpc.Server, error) {
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale socket %s: %w", sock, err)
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", sock, err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			klog.ErrorS(err, "device plugin server stopped", "socket", sock)
		}
	}()
	return srv, nil
}

func (p *Plugin) register(ctx context.Context, kubeletSock string) error {
	conn, err := grpc.NewClient("unix://"+kubeletSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("dial kubelet at %s: %w", kubeletSock, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     p.cfg.SocketName,
		ResourceName: p.cfg.ResourceName,
		Options:      &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true},
	})
	if err != nil {
		return fmt.Errorf("register %s with kubelet at %s: %w", p.cfg.ResourceName, kubeletSock, err)
	}
	p.mu.Lock()
	p.registrations++
	p.mu.Unlock()
	return nil
}
