package deviceplugin

import (
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// Forget drops what the plugin remembers of pods that are not in live (the
// UIDs of the pods bound to this node now): the refusals and unsafe
// requests it already raised an Event for. Without it those maps grow with
// every pod UID for the agent's life. A pod in live keeps its entries, so
// it is still told once.
func (p *Plugin) Forget(live map[types.UID]bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
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
	return len(p.refused) + len(p.toldUnsafe)
}
