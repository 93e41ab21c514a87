package install

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/gpupack/gpupack/test/framework"
)

// The Grafana dashboard only queries metrics gpupack registers: a renamed
// metric must not leave a panel silently empty.
func TestGrafanaDashboardQueriesRealMetrics(t *testing.T) {
	root := framework.RepoRoot()
	raw, err := os.ReadFile(filepath.Join(root, "docs", "grafana", "gpupack-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard is not JSON: %v", err)
	}
	out, err := exec.Command("git", "-C", root, "grep", "-h", "-o", "-E", `"gpupack_[a-z_]+"`, "--", "*.go").Output()
	if err != nil {
		t.Fatalf("git grep: %v", err)
	}
	registered := map[string]bool{}
	for _, m := range strings.Fields(string(out)) {
		registered[strings.Trim(m, `"`)] = true
	}
	name := regexp.MustCompile(`gpupack_[a-z_]+`)
	if len(dash.Panels) == 0 {
		t.Fatal("dashboard has no panels")
	}
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, m := range name.FindAllString(tg.Expr, -1) {
				base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m, "_bucket"), "_sum"), "_count")
				if !registered[base] {
					t.Errorf("panel %q queries %s, which no gpupack code registers", p.Title, m)
				}
			}
		}
	}
}
