// Package mysqlstore is a stores.Store on MySQL or MariaDB through
// database/sql.
package mysqlstore
