package node

import (
	"testing"

	v1alpha1 "github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/devicehook/node/agent"
	"github.com/gpupack/gpupack/devicehook/node/deviceplugin"
	"github.com/gpupack/gpupack/webhooks/mutation"
)

// TestLayoutMatchesWebhook: the webhook mounts the hook and each
// container's accounting dir; the node agent installs the hook there and
// reads the accounting files back (drift). Both must name the same paths.
func TestLayoutMatchesWebhook(t *testing.T) {
	w := mutation.Default().Hook
	o := agent.DefaultOptions()
	checks := []struct{ what, webhook, node string }{
		{"hook host dir", w.HostPath, o.HookDir},
		{"hook library", w.Library, v1alpha1.HookLibraryName},
		{"preload file", w.PreloadFile, "ld.so.preload"},
		{"accounting host root", w.SharedCacheHostPath, o.CacheDir},
		{"accounting mount path", w.SharedCacheMountPath, deviceplugin.CacheMountPath},
		{"accounting file", mutation.SharedCacheFileName, deviceplugin.CacheFileName},
	}
	for _, c := range checks {
		if c.webhook != c.node {
			t.Errorf("%s: webhook %q, node agent %q", c.what, c.webhook, c.node)
		}
	}
}
