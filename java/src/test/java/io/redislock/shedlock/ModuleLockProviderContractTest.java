package io.redislock.shedlock;

import static org.junit.jupiter.api.Assertions.assertEquals;

import io.redislock.LockClient;
import io.redislock.TestServer;
import net.javacrumbs.shedlock.core.ExtensibleLockProvider;
import net.javacrumbs.shedlock.test.support.AbstractExtensibleLockProviderIntegrationTest;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;

/**
 * ShedLock's own contract for an {@link ExtensibleLockProvider}, from
 * {@code shedlock-test-support}: lock, no second lock, lockAtMostFor,
 * lockAtLeastFor, extend, and its fuzz test, against a real server.
 */
class ModuleLockProviderContractTest extends AbstractExtensibleLockProviderIntegrationTest {
  static TestServer server;
  static LockClient client;
  static ModuleLockProvider provider;

  @BeforeAll
  static void start() throws Exception {
    server = TestServer.start();
    client = LockClient.create(server.url());
    provider = new ModuleLockProvider(client);
  }

  @AfterAll
  static void stop() throws Exception {
    client.close();
    server.close();
  }

  @Override
  protected ExtensibleLockProvider getLockProvider() {
    return provider;
  }

  @Override
  protected void assertUnlocked(String name) {
    assertEquals(0L, server.cmd().exists("shedlock:" + name), name + " is held");
  }

  @Override
  protected void assertLocked(String name) {
    assertEquals(1L, server.cmd().exists("shedlock:" + name), name + " is free");
  }
}
