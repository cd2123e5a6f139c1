// Command creditd runs the credit-metering service and its operator tools.
//
//	creditd serve     run the API, the persister and the expiry sweep (default)
//	creditd rebuild   rebuild every customer's Redis state from Postgres
//	creditd migrate   apply database migrations and exit
//	creditd admin ... operator commands (tenants, API keys, webhooks); see `creditd admin help`
//	creditd deadletters list|retry|discard  mutations Postgres refused; see `creditd deadletters help`
//	creditd reconcile [--fix]  compare every customer's Redis state with Postgres; see `creditd reconcile help`
//
// Configuration comes from the environment (addendum 11): REDIS_URL,
// DATABASE_URL, CREDITD_ADDR, CREDITD_ADMIN_TOKEN, LOG_LEVEL and the
// CREDITD_* settings listed in README.md.
package main

import (
	"fmt"
	"os"
)

func main() {
	args := os.Args[1:]
	cmd := "serve"
	if len(args) > 0 {
		cmd, args = args[0], args[1:]
	}
	var err error
	switch cmd {
	case "serve":
		err = serve()
	case "rebuild":
		err = rebuild()
	case "migrate":
		err = migrate()
	case "admin":
		err = admin(args)
	case "deadletters":
		err = deadletters(args)
	case "reconcile":
		err = reconcile(args)
	case "help", "-h", "--help":
		fmt.Println("usage: creditd [serve|rebuild|migrate|admin ...|deadletters ...|reconcile [--fix]]")
		return
	default:
		err = fmt.Errorf("unknown command %q (try: serve, rebuild, migrate, admin, deadletters, reconcile)", cmd)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "creditd:", err)
		os.Exit(1)
	}
}
