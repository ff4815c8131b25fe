package httpapi

import (
	"errors"
	"testing"

	"github.com/oncegate/oncegate/dashboard"
)

// TestDashboardAccess: the rules, case by case.
func TestDashboardAccess(t *testing.T) {
	isAdmin := func(k string) bool { return k == "sk-admin" }
	tenantOf := func(k string) (string, bool) {
		if k == "sk-acme" {
			return "acme", true
		}
		return "", false
	}
	all, acme := dashboard.Scope{All: true}, dashboard.Scope{Tenant: "acme"}
	cases := []struct {
		name                      string
		tenants, public, loopback bool
		key                       string
		want                      dashboard.Scope
		err                       error
	}{
		{"no tenants, loopback", false, false, true, "", all, nil},
		{"no tenants, remote", false, false, false, "", dashboard.Scope{}, errDashboardLoopback},
		{"no tenants, remote, a key changes nothing", false, false, false, "sk-admin", dashboard.Scope{}, errDashboardLoopback},
		{"no tenants, remote, public", false, true, false, "", all, nil},
		{"tenants, no key (even from loopback)", true, false, true, "", dashboard.Scope{}, errMissingAPIKey},
		{"tenants, no key, public changes nothing", true, true, true, "", dashboard.Scope{}, errMissingAPIKey},
		{"tenants, admin key", true, false, false, "sk-admin", all, nil},
		{"tenants, a tenant's key", true, false, false, "sk-acme", acme, nil},
		{"tenants, a wrong key", true, false, true, "sk-nobody", dashboard.Scope{}, errInvalidAPIKey},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := dashboardAccess(c.tenants, c.public, c.loopback, c.key, isAdmin, tenantOf)
			if !errors.Is(err, c.err) || got != c.want {
				t.Errorf("got %+v, %v; want %+v, %v", got, err, c.want, c.err)
			}
		})
	}
}
