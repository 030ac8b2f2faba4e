package testservers

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
)

// EtcdCluster starts an etcd cluster of n members for the calling test and
// waits until every member is healthy. A Server's Addr is its client
// address, which an etcd client takes as an endpoint. Restart brings a
// member back with its data; RestartEmpty replaces it, through the other
// members (which need a quorum), with an empty member of the same name and
// addresses, as after a lost disk.
func EtcdCluster(tb testing.TB, n int) []*Server {
	tb.Helper()
	needPrivate(tb, "EtcdCluster", findEtcd)
	return private(tb, "etcd-cluster", func(g *group) ([]*Server, error) {
		return startEtcd(tb, g, n)
	})
}

func findEtcd() error {
	_, err := findProgram("etcd")
	return err
}

// etcdMember is what an etcd member's command line is built from; it
// changes when RestartEmpty replaces the member.
type etcdMember struct {
	name, clientURL, peerURL string

	mu             sync.Mutex
	initialCluster string // name=peerURL,...
	state          string // "new", or "existing" for a replacement
	clusterID      string // X-Etcd-Cluster-Id, once the cluster formed
}

func startEtcd(tb testing.TB, g *group, n int) ([]*Server, error) {
	ports, err := freePorts(2 * n)
	if err != nil {
		return nil, err
	}
	// A random token makes the cluster's ID this run's own.
	token := "reqlock-" + strings.ToLower(rand.Text()[:12])
	members := make([]*etcdMember, n)
	var initial []string
	for i := range members {
		m := &etcdMember{
			name:      fmt.Sprintf("%s-%d", token, i+1),
			clientURL: fmt.Sprintf("http://127.0.0.1:%d", ports[i]),
			peerURL:   fmt.Sprintf("http://127.0.0.1:%d", ports[n+i]),
			state:     "new",
		}
		members[i] = m
		initial = append(initial, m.name+"="+m.peerURL)
	}
	servers := make([]*Server, n)
	for i, m := range members {
		m.initialCluster = strings.Join(initial, ",")
		s, err := g.newServer(tb, "etcd", ports[i])
		if err != nil {
			return nil, err
		}
		dataDir := s.dir + "/data"
		s.args = func() []string {
			m.mu.Lock()
			defer m.mu.Unlock()
			return []string{"etcd", "--name", m.name, "--data-dir", dataDir,
				"--listen-client-urls", m.clientURL, "--advertise-client-urls", m.clientURL,
				"--listen-peer-urls", m.peerURL, "--initial-advertise-peer-urls", m.peerURL,
				"--initial-cluster", m.initialCluster, "--initial-cluster-token", token,
				"--initial-cluster-state", m.state, "--logger", "zap", "--log-outputs", "stderr"}
		}
		// A member serves clients only once it is part of a cluster with
		// a quorum; its peer port answers before, so that a member can be
		// restarted while the others are down.
		s.ready = func(ctx context.Context, _ int) error { return m.peerReady(ctx) }
		s.wipe = func() error { return os.RemoveAll(dataDir) }
		others := func() []*Server {
			return slices.DeleteFunc(slices.Clone(servers), func(o *Server) bool { return o == s })
		}
		s.rejoin = func(ctx context.Context) error { return m.replace(ctx, others()) }
		servers[i] = s
	}
	if err := startAll(servers...); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	for i, m := range members {
		if err := poll(ctx, nil, m.healthy); err != nil {
			return nil, fmt.Errorf("etcd member %s: %w; log: %s", m.clientURL, err, servers[i].logTail())
		}
	}
	return servers, nil
}

// peerReady reports nil once the member's peer port answers for this
// cluster (the first time, for any: healthy checks the member then).
func (m *etcdMember) peerReady(ctx context.Context) error {
	resp, err := etcdHTTP(ctx, http.MethodGet, m.peerURL+"/members", "")
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.clusterID != "" && resp.clusterID != m.clusterID {
		return fmt.Errorf("%s answers for cluster %s, not %s", m.peerURL, resp.clusterID, m.clusterID)
	}
	return nil
}

// healthy reports nil when the member serves clients, has a leader and
// commits (GET /health), and is this member: the member that answers a
// member list has this member's peer address. It records the cluster's ID.
func (m *etcdMember) healthy(ctx context.Context) error {
	resp, err := etcdHTTP(ctx, http.MethodGet, m.clientURL+"/health", "")
	if err != nil {
		return err
	}
	var health struct{ Health string }
	if err := json.Unmarshal(resp.body, &health); err != nil || health.Health != "true" {
		return fmt.Errorf("health %s", resp.body)
	}
	list, err := etcdMembers(ctx, m.clientURL)
	if err != nil {
		return err
	}
	for _, mm := range list.Members {
		if mm.ID == list.Header.MemberID && slices.Contains(mm.PeerURLs, m.peerURL) {
			peers, err := etcdHTTP(ctx, http.MethodGet, m.peerURL+"/members", "")
			if err != nil {
				return err
			}
			m.mu.Lock()
			m.clusterID = peers.clusterID
			m.mu.Unlock()
			return nil
		}
	}
	return fmt.Errorf("%s is not member %s: %s", m.clientURL, m.name, list.raw)
}

// replace removes the member from its cluster and adds a new one with the
// same peer address, through the first of the other members that answers,
// and makes the member's next start join as that new, empty member. etcd
// refuses a change until every member has been connected for 5s (a member
// that just restarted has not), so each request is retried while it says
// the cluster is unhealthy.
func (m *etcdMember) replace(ctx context.Context, others []*Server) error {
	var errs []error
	for _, o := range others {
		if !o.current().running() {
			continue
		}
		url := "http://" + o.Addr()
		list, err := etcdMembers(ctx, url)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, mm := range list.Members {
			if slices.Contains(mm.PeerURLs, m.peerURL) {
				body := fmt.Sprintf(`{"ID":%q}`, mm.ID)
				if _, err := etcdChange(ctx, url+"/v3/cluster/member/remove", body); err != nil {
					return fmt.Errorf("remove member %s: %w", m.name, err)
				}
			}
		}
		body := fmt.Sprintf(`{"peerURLs":[%q]}`, m.peerURL)
		resp, err := etcdChange(ctx, url+"/v3/cluster/member/add", body)
		if err != nil {
			return fmt.Errorf("add member %s: %w", m.name, err)
		}
		var added etcdMemberList
		if err := json.Unmarshal(resp.body, &added); err != nil {
			return fmt.Errorf("add member %s: %w: %s", m.name, err, resp.body)
		}
		var initial []string
		for _, mm := range added.Members {
			name := mm.Name
			if slices.Contains(mm.PeerURLs, m.peerURL) {
				name = m.name // the new member has no name until it starts
			}
			for _, p := range mm.PeerURLs {
				initial = append(initial, name+"="+p)
			}
		}
		m.mu.Lock()
		m.initialCluster = strings.Join(initial, ",")
		m.state = "existing"
		m.mu.Unlock()
		return nil
	}
	return fmt.Errorf("no running member to replace %s through: %v", m.name, errs)
}

// etcdChange POSTs a membership change, again while etcd answers that the
// cluster is not healthy enough for one yet.
func etcdChange(ctx context.Context, url, body string) (*etcdResponse, error) {
	var resp *etcdResponse
	err := poll(ctx, nil, func(ctx context.Context) error {
		var err error
		resp, err = etcdHTTP(ctx, http.MethodPost, url, body)
		if err != nil && !strings.Contains(err.Error(), "unhealthy cluster") {
			return permanent{err}
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

type etcdMemberList struct {
	Header struct {
		MemberID string `json:"member_id"`
	} `json:"header"`
	Members []struct {
		ID       string   `json:"ID"`
		Name     string   `json:"name"`
		PeerURLs []string `json:"peerURLs"`
	} `json:"members"`
	raw []byte
}

// etcdMembers asks the member at clientURL for the member list, through
// etcd's JSON gateway (so no etcd client module is needed).
func etcdMembers(ctx context.Context, clientURL string) (*etcdMemberList, error) {
	resp, err := etcdHTTP(ctx, http.MethodPost, clientURL+"/v3/cluster/member/list", "{}")
	if err != nil {
		return nil, err
	}
	list := &etcdMemberList{raw: resp.body}
	if err := json.Unmarshal(resp.body, list); err != nil {
		return nil, fmt.Errorf("member list: %w: %s", err, resp.body)
	}
	return list, nil
}

type etcdResponse struct {
	body      []byte
	clusterID string
}

// etcdHTTP makes one request, on a connection of its own, and fails unless
// the answer is 200 OK.
func etcdHTTP(ctx context.Context, method, url, body string) (*etcdResponse, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewBufferString(body))
	if err != nil {
		return nil, err
	}
	req.Close = true
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := etcdClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s %s: %s: %s", method, url, resp.Status, bytes.TrimSpace(b))
	}
	return &etcdResponse{body: b, clusterID: resp.Header.Get("X-Etcd-Cluster-Id")}, nil
}

var etcdClient = &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
