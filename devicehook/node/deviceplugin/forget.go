package deviceplugin

import (
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// allocatedGrace is how long Forget keeps the allocation count of a pod the
// pod list does not show: the kubelet allocates a pod's containers one
// after another within seconds of its binding, and the list (an informer)
// may not show a just-bound pod yet; dropping its count then would hand its
// next container the first container's GPUs again.
const allocatedGrace = 10 * time.Minute

// now is the plugin's clock (tests move it).
var now = time.Now

// Forget drops what the plugin remembers of pods that are not in live (the
// UIDs of the pods bound to this node now): the refusals and unsafe
// requests it already raised an Event for. Without it those maps grow with
// every pod UID for the agent's life. A pod in live keeps its entries, so
// it is still told once. The count of containers allocated per pod goes
// too, allocatedGrace after the pod's last allocation.
func (p *Plugin) Forget(live map[types.UID]bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for uid := range p.allocated {
		if !live[uid] && now().Sub(p.allocatedAt[uid]) > allocatedGrace {
			delete(p.allocated, uid)
			delete(p.allocatedAt, uid)
		}
	}
	for uid := range p.refused {
		if !live[uid] {
			delete(p.refused, uid)
		}
	}
	for key := range p.toldUnsafe {
		uid, _, _ := strings.Cut(key, "/") // "<uid>/<reason>"
		if !live[types.UID(uid)] {
			delete(p.toldUnsafe, key)
		}
	}
}

// remembered counts the entries Forget prunes (tests).
func (p *Plugin) remembered() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.refused) + len(p.toldUnsafe) + len(p.allocated)
}
