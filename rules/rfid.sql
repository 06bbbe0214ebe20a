-- RFID rules over the door readers (ESL §7, examples 17 and 18).
-- One reading per tag seen at a door: tagid, tagtype ('item', 'case', 'pallet', or
-- 'ap' = authorised person), door, and the reading's own event time ts.
CREATE STREAM tag_readings (tagid STRING, tagtype STRING, door STRING, ts TIMESTAMP)
  ORDER BY ts SLACK 2 SECONDS SOURCE 'lookout/rfid/+/readings';

-- The door registry (a reference table, rules/doors.csv): each reader's role in the
-- warehouse. The simulator's default layout: reader 0 the packing table, door 1
-- receiving, doors 2-3 aisles, door 4 the shipping exit. Rules name roles, not readers.
CREATE TABLE doors (door STRING, role STRING) FROM CSV 'doors.csv';

-- packing_groups (ESL example 17): items read at a packing table less than 2 s apart
-- are packed into the same case; a longer gap starts the next group. packing_group()
-- is non-blocking and keeps only the previous item's time.
CREATE AGGREGATE packing_group(tagtime TIMESTAMP) RETURNS BIGINT
  LANGUAGE PYTHON AS 'rules.udas:PackingGroup';
CREATE STREAM packing_groups AS
  SELECT r.tagid, r.door, r.ts,
         packing_group(r.ts) OVER (PARTITION BY door ROWS UNBOUNDED PRECEDING) AS group_no
  FROM tag_readings r JOIN doors d ON r.door = d.door
  WHERE r.tagtype = 'item' AND d.role = 'packing';

-- larceny (ESL example 18): an item leaves through a shipping door and no authorised
-- person is read at that door within 5 s before or after it. Active expiration fires the
-- check 5 s after the item, even if nothing else is read at the door. Each theft is an
-- event, not a state: thefts at one door at most 10 minutes apart are one incident,
-- resolved 10 minutes after the last.
CREATE AGGREGATE item_alarm(tagid STRING, tagtype STRING, tagtime TIMESTAMP) RETURNS STRING
  LANGUAGE PYTHON AS 'rules.udas:ItemAlarm';
CREATE ALERT larceny SEVERITY critical
  MESSAGE 'item {tagid} left through door {door} without an authorised person'
  RESOLVE AFTER 10 MINUTES
  AS SELECT r.tagid, r.door, r.ts AS tagtime,
            item_alarm(r.tagid, r.tagtype, r.ts) OVER (PARTITION BY door RANGE 5 SECONDS PRECEDING ACTIVE EXPIRATION) AS alarm
     FROM tag_readings r JOIN doors d ON r.door = d.door
     WHERE d.role = 'shipping';

-- missed_shipping: a tag read at a receiving door and not at a shipping door within
-- 30 minutes (the door roles of the registry are what the aggregate compares). The
-- incident resolves when the tag is read at a shipping door after all.
CREATE AGGREGATE missed_door(door STRING, next_door STRING) RETURNS STRING
  LANGUAGE PYTHON AS 'rules.udas:MissedDoor';
CREATE ALERT missed_shipping SEVERITY warning
  MESSAGE 'tag {tagid} seen at {last_door} but not at shipping within 30 minutes'
  RESOLVE WHEN d.role = 'shipping'
  AS SELECT r.tagid,
            missed_door(d.role, 'shipping') OVER (PARTITION BY tagid RANGE 30 MINUTES PRECEDING ACTIVE EXPIRATION) AS last_door
     FROM tag_readings r JOIN doors d ON r.door = d.door
     WHERE d.role IN ('receiving', 'shipping') AND r.tagtype <> 'ap';

-- daily_door_counts: a running count of readings per door that resets at midnight
-- UTC (a landmark window with a periodic reset): each reading is stamped with its day,
-- and the unbounded window is partitioned by door and day.
CREATE STREAM door_days AS
  SELECT door, ts, time_bucket(INTERVAL 1 DAY, ts) AS day FROM tag_readings;
CREATE STREAM daily_door_counts AS
  SELECT door, day, ts,
         count(*) OVER (PARTITION BY door, day RANGE UNBOUNDED PRECEDING) AS readings
  FROM door_days;

-- door_day_totals: the day's final count per door, one row per door when the day
-- ends (a one-day tumble: extents [midnight, next midnight)).
CREATE STREAM door_day_totals AS
  SELECT door, window_end, count(*) AS readings
  FROM tag_readings [RANGE 1 DAY]
  GROUP BY door;
