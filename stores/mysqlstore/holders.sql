CREATE TABLE IF NOT EXISTS {holders} (
  key_sum    VARBINARY(32) NOT NULL COMMENT 'SHA-256 of the key',
  writer     TINYINT       NOT NULL COMMENT '0: a holder; 1: the record of a waiting writer',
  token_sum  VARBINARY(32) NOT NULL COMMENT 'SHA-256 of the holder''s or the writer''s token',
  expires_at DATETIME(6)   NOT NULL COMMENT 'UTC, by the server''s clock: the place, or the record, ends then',
  PRIMARY KEY (key_sum, writer, token_sum)
) ENGINE=InnoDB COMMENT='reqlock shared holders (github.com/reqlock/reqlock/stores/mysqlstore)'
